import { JupyterFrontEnd } from '@jupyterlab/application';
import { Contents } from '@jupyterlab/services';

/**
 * Open the notebook attached to a run, creating it the first time: `ortlab.attach(...)` and the live
 * charts (`ortlab.ui.RunMonitor`). Strings are written as JSON literals, which Python reads as the same
 * strings, so no run id or folder can break out of the quotes.
 */
export async function attachNotebook(
  app: JupyterFrontEnd,
  id: string,
  root: string
): Promise<void> {
  const path = `ortlab-${id}.ipynb`;
  const contents = app.serviceManager.contents;
  let exists = true;
  try {
    await contents.get(path, { content: false });
  } catch {
    exists = false;
  }
  if (!exists) {
    const rootArg = root ? `, root=${JSON.stringify(root)}` : '';
    const source = [
      'import ortlab\n',
      `run = ortlab.attach(${JSON.stringify(id)}${rootArg})\n`,
      'ortlab.ui.RunMonitor(run)'
    ];
    const notebook = {
      cells: [{ cell_type: 'code', execution_count: null, metadata: {}, outputs: [], source }],
      metadata: {
        kernelspec: { name: 'python3', display_name: 'Python 3', language: 'python' }
      },
      nbformat: 4,
      nbformat_minor: 5
    };
    const model: Partial<Contents.IModel> = { type: 'notebook', format: 'json', content: notebook };
    await contents.save(path, model);
  }
  await app.commands.execute('docmanager:open', { path });
}
