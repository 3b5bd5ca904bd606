/**
 * ortlab's JupyterLab sidebar: the runs under the server's runs folder, live, with Stop/Resume, a New run
 * form and the doctor's summary. The logic lives in ortlab (Python); this is a view over its REST API.
 */
import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { ITranslator, nullTranslator } from '@jupyterlab/translation';

import { ortlabIcon } from './icon';
import { attachNotebook } from './notebook';
import { RunsModel } from './model';
import { RunsPanel } from './panel';

const PLUGIN_ID = 'ortlab-sidebar:plugin';

namespace CommandIDs {
  export const show = 'ortlab:show-runs';
  export const newRun = 'ortlab:new-run';
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description:
    "ortlab's runs in the left sidebar: live progress, stop/resume, new runs, the doctor.",
  autoStart: true,
  optional: [ILayoutRestorer, ICommandPalette, ISettingRegistry, ITranslator],
  activate: (
    app: JupyterFrontEnd,
    restorer: ILayoutRestorer | null,
    palette: ICommandPalette | null,
    settingRegistry: ISettingRegistry | null,
    translator: ITranslator | null
  ) => {
    const trans = (translator ?? nullTranslator).load('ortlab');
    const model = new RunsModel({ liveInterval: 500, idleInterval: 3000, maxPoints: 200 });
    const panel = new RunsPanel(
      model,
      { openNotebook: (id, root) => attachNotebook(app, id, root) },
      trans
    );
    panel.id = 'ortlab-runs';
    panel.title.icon = ortlabIcon;
    panel.title.caption = trans.__('ortlab runs');
    app.shell.add(panel, 'left', { rank: 650 });
    restorer?.add(panel, 'ortlab-runs');
    model.start(() => panel.isVisible);

    app.commands.addCommand(CommandIDs.show, {
      label: trans.__('ortlab: Show runs'),
      caption: trans.__("Show ortlab's runs in the left sidebar"),
      icon: ortlabIcon,
      execute: () => app.shell.activateById(panel.id)
    });
    app.commands.addCommand(CommandIDs.newRun, {
      label: trans.__('ortlab: New run'),
      caption: trans.__('Start an ortlab run from a small form'),
      execute: () => {
        app.shell.activateById(panel.id);
        panel.showNewRun();
      }
    });
    if (palette) {
      const category = 'ortlab';
      palette.addItem({ command: CommandIDs.show, category });
      palette.addItem({ command: CommandIDs.newRun, category });
    }

    if (settingRegistry) {
      const apply = (settings: ISettingRegistry.ISettings) => {
        model.configure({
          liveInterval: settings.get('liveInterval').composite as number,
          idleInterval: settings.get('idleInterval').composite as number,
          maxPoints: settings.get('sparklinePoints').composite as number
        });
      };
      settingRegistry
        .load(PLUGIN_ID)
        .then(settings => {
          apply(settings);
          settings.changed.connect(apply);
        })
        .catch(reason => console.error('ortlab: cannot load the sidebar settings', reason));
    }
  }
};

export default plugin;
