/**
 * The sidebar's views. Everything from the server is rendered as React text (never as HTML), so a run name
 * or a reason with markup in it shows as text.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import {
  addIcon,
  Button,
  notebookIcon,
  ReactWidget,
  refreshIcon,
  runIcon,
  stopIcon,
  ToolbarButtonComponent
} from '@jupyterlab/ui-components';
import { Message } from '@lumino/messaging';
import * as React from 'react';

import { ApiError, IDoctor, IRunRow, ISpecForm } from './api';
import { EstimateLine } from './estimate';
import { describe, LIVE_STATES, RunsModel } from './model';
import {
  choices,
  defaultText,
  description,
  exclusiveWith,
  fieldInput,
  fieldTexts,
  requestSpec,
  taskFields
} from './specform';
import { Sparkline } from './sparkline';

/** What the panel asks the application to do. */
export interface IPanelActions {
  openNotebook(id: string, root: string): Promise<void>;
}

/** The left-area widget: a ReactWidget that redraws when the model changes and polls only while shown. */
export class RunsPanel extends ReactWidget {
  constructor(
    readonly model: RunsModel,
    private readonly actions: IPanelActions,
    private readonly trans: TranslationBundle
  ) {
    super();
    this.addClass('ortlab-Sidebar');
    this.model.changed.connect(() => this.update(), this);
  }

  /** Opens the New run form (the palette's "New run" command). */
  showNewRun(): void {
    this._formOpen = true;
    this.update();
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this.model.kick();
  }

  dispose(): void {
    this.model.dispose();
    super.dispose();
  }

  protected render(): JSX.Element {
    return (
      <SidebarView
        model={this.model}
        actions={this.actions}
        trans={this.trans}
        formOpen={this._formOpen}
        setFormOpen={open => {
          this._formOpen = open;
          this.update();
        }}
      />
    );
  }

  private _formOpen = false;
}

interface IViewProps {
  model: RunsModel;
  actions: IPanelActions;
  trans: TranslationBundle;
  formOpen: boolean;
  setFormOpen(open: boolean): void;
}

function SidebarView(props: IViewProps): JSX.Element {
  const { model, trans } = props;
  const runs = model.runs; // in the server's order (newest first)
  return (
    <div
      className="ortlab-Sidebar-body"
      data-poll-ms={Math.round(model.lastPollMs)}
      data-wait-ms={Math.round(model.wait)}
    >
      <div className="ortlab-Sidebar-header">
        <h2 className="ortlab-Sidebar-title">{trans.__('ortlab runs')}</h2>
        <ToolbarButtonComponent
          className="ortlab-NewRunButton"
          icon={addIcon}
          label={trans.__('New run')}
          tooltip={trans.__('Start a run from a small form')}
          onClick={() => props.setFormOpen(!props.formOpen)}
        />
        <ToolbarButtonComponent
          icon={refreshIcon}
          tooltip={trans.__('Refresh the runs and the doctor')}
          onClick={() => {
            void model.loadDoctor();
            void model.loadForm();
            model.kick();
          }}
        />
      </div>
      {model.root ? (
        <div className="ortlab-Sidebar-root" title={model.root}>
          {trans.__('runs folder: %1', model.root)}
        </div>
      ) : null}
      {model.error ? (
        <div className="ortlab-Error" role="alert">
          {model.error}
        </div>
      ) : null}
      <DoctorSummary doctor={model.doctor} trans={trans} />
      {props.formOpen && model.form ? (
        <NewRunForm
          model={model}
          form={model.form}
          trans={trans}
          onClose={() => props.setFormOpen(false)}
        />
      ) : props.formOpen ? (
        <div className="ortlab-NewRun-loading">{trans.__("Loading the run spec's fields…")}</div>
      ) : null}
      {model.loaded && runs.length === 0 ? (
        <p className="ortlab-Empty">{trans.__('No runs yet. Start one with New run.')}</p>
      ) : null}
      <ul className="ortlab-RunList">
        {runs.map(run => (
          <RunItem key={run.id} run={run} {...props} />
        ))}
      </ul>
    </div>
  );
}

function formatNumber(value: number | null, digits: number): string {
  return value === null || !Number.isFinite(value) ? '–' : value.toFixed(digits);
}

function RunItem(props: IViewProps & { run: IRunRow }): JSX.Element {
  const { run, model, trans } = props;
  const [busy, setBusy] = React.useState(false);
  const [problem, setProblem] = React.useState<string | null>(null);
  const live = LIVE_STATES.has(run.state);
  const series = model.series(run.id);
  const step = model.latestStep(run);
  const act = async (what: () => Promise<void>) => {
    setBusy(true);
    setProblem(null);
    try {
      await what();
    } catch (error) {
      setProblem(describe(error));
    } finally {
      setBusy(false);
    }
  };
  const pendingCheck = run.requested.filter(
    a => !run.applied.includes(a) && !run.not_applied.includes(a)
  );
  return (
    <li className="ortlab-Run" data-run-id={run.id} data-state={run.state}>
      <div className="ortlab-Run-head">
        <span className={`ortlab-Badge ortlab-Badge-${safeClass(run.state)}`}>{run.state}</span>
        <span className="ortlab-Run-name" title={run.id}>
          {run.id}
        </span>
      </div>
      <div className="ortlab-Run-stats">
        <span className="ortlab-Run-step">
          {trans.__('step %1 / %2', step, run.max_steps === null ? '?' : run.max_steps)}
        </span>
        <span className="ortlab-Run-speed">
          {trans.__('%1 samples/s', formatNumber(run.samples_per_s, 1))}
        </span>
        {run.loss !== null ? (
          <span className="ortlab-Run-loss">{trans.__('loss %1', formatNumber(run.loss, 3))}</span>
        ) : null}
        {(run.world_size ?? 1) > 1 ? (
          <span className="ortlab-Run-workers">{trans.__('%1 workers', run.world_size ?? 1)}</span>
        ) : null}
        {(run.restarts ?? 0) > 0 ? (
          <span className="ortlab-Run-restarts">
            {trans._n('%1 restart', '%1 restarts', run.restarts ?? 0)}
          </span>
        ) : null}
      </div>
      {run.error ? (
        // (text from the run folder: React renders it as text, never as markup)
        <div className="ortlab-Run-error" title={run.error}>
          {run.error}
        </div>
      ) : null}
      <div className="ortlab-Run-mix">
        {run.applied.length === 0 && run.requested.length === 0 && run.not_applied.length === 0 ? (
          <span className="ortlab-Chip ortlab-Chip-plain">{trans.__('plain PyTorch')}</span>
        ) : null}
        {run.applied.map(a => (
          <span
            key={`a-${a}`}
            className="ortlab-Chip ortlab-Chip-applied"
            title={trans.__('applied')}
          >
            {a}
          </span>
        ))}
        {pendingCheck.map(a => (
          <span
            key={`r-${a}`}
            className="ortlab-Chip ortlab-Chip-requested"
            title={trans.__('requested; not verified yet')}
          >
            {a}?
          </span>
        ))}
        {run.not_applied.length > 0 ? (
          <span className="ortlab-Run-notApplied" title={trans.__('requested but not applied')}>
            {trans.__('not applied: %1', run.not_applied.join(', '))}
          </span>
        ) : null}
      </div>
      {series && (live || series.steps.length > 0) ? (
        <div className="ortlab-Run-charts">
          <Sparkline
            className="ortlab-Sparkline-loss"
            label={trans.__('loss')}
            values={series.loss}
            steps={series.steps}
            format={v => v.toFixed(3)}
          />
          <Sparkline
            className="ortlab-Sparkline-speed"
            label={trans.__('samples/s')}
            values={series.samplesPerS}
            steps={series.steps}
            format={v => v.toFixed(1)}
          />
        </div>
      ) : null}
      <div className="ortlab-Run-actions">
        {live ? (
          <Button
            className="ortlab-Stop"
            minimal
            small
            disabled={busy}
            title={trans.__('Stop after the current step (a checkpoint is saved)')}
            onClick={() => void act(() => model.stop(run.id))}
          >
            <stopIcon.react tag="span" className="ortlab-ButtonIcon" />
            {trans.__('Stop')}
          </Button>
        ) : null}
        {run.state === 'stopped' || run.state === 'failed' ? (
          <Button
            className="ortlab-Resume"
            minimal
            small
            disabled={busy}
            title={trans.__('Resume from the last checkpoint')}
            onClick={() => void act(() => model.resume(run.id))}
          >
            <runIcon.react tag="span" className="ortlab-ButtonIcon" />
            {trans.__('Resume')}
          </Button>
        ) : null}
        <Button
          className="ortlab-OpenNotebook"
          minimal
          small
          disabled={busy}
          title={trans.__('Open a notebook attached to this run, with its live charts')}
          onClick={() => void act(() => props.actions.openNotebook(run.id, model.root))}
        >
          <notebookIcon.react tag="span" className="ortlab-ButtonIcon" />
          {trans.__('Open in a notebook')}
        </Button>
      </div>
      {problem ? (
        <div className="ortlab-Error" role="alert">
          {problem}
        </div>
      ) : null}
    </li>
  );
}

/** A state name as a CSS class suffix (states are a known set; anything else becomes `other`). */
function safeClass(state: string): string {
  return /^[a-z]+$/.test(state) ? state : 'other';
}

/** The doctor's answer in one line of chips, with the reasons of what cannot run folded underneath. */
function DoctorSummary(props: { doctor: IDoctor | null; trans: TranslationBundle }): JSX.Element {
  const { doctor, trans } = props;
  if (doctor === null) {
    return <div className="ortlab-Doctor">{trans.__('doctor: not loaded')}</div>;
  }
  const entries = Object.entries(doctor.accelerations);
  const missing = entries.filter(([, a]) => !a.available || a.slow);
  return (
    <div className="ortlab-Doctor">
      <div className="ortlab-Doctor-line">
        <span className="ortlab-Doctor-title">{trans.__('doctor')}</span>
        {entries.map(([name, a]) => (
          <span
            key={name}
            className={`ortlab-Chip ${a.available ? (a.slow ? 'ortlab-Chip-slow' : 'ortlab-Chip-ok') : 'ortlab-Chip-no'}`}
            title={a.reason ?? ''}
          >
            {a.available ? (a.slow ? '◐ ' : '✓ ') : '✗ '}
            {name}
          </span>
        ))}
      </div>
      {!doctor.probed ? (
        <div className="ortlab-Doctor-note">
          {trans.__('Not probed yet: run `ortlab doctor` once in a terminal for exact answers.')}
        </div>
      ) : null}
      {missing.length > 0 ? (
        <details className="ortlab-Doctor-details">
          <summary>{trans.__('why not everything')}</summary>
          <ul>
            {missing.map(([name, a]) => (
              <li key={name}>
                <strong>{name}</strong>
                {a.slow && a.available ? ` (${trans.__('slower here')})` : ''}: {a.reason ?? ''}
                {a.remedy ? <div className="ortlab-Doctor-remedy">{a.remedy}</div> : null}
              </li>
            ))}
          </ul>
        </details>
      ) : null}
    </div>
  );
}

/**
 * The New run form. Its choices (every task), starting values and tooltips come from RunSpec's schema and
 * defaults as the server sends them (`GET spec`), and so do the acceleration toggles and the fields they set
 * (ortlab.toggles), so the form offers what this ortlab accepts.
 */
function NewRunForm(props: {
  model: RunsModel;
  form: ISpecForm;
  trans: TranslationBundle;
  onClose(): void;
}): JSX.Element {
  const { model, form, trans } = props;
  const tasks = choices(form, 'task');
  const [name, setName] = React.useState('');
  const [modelName, setModelName] = React.useState(defaultText(form, 'model.name'));
  const [source, setSource] = React.useState(defaultText(form, 'data.source'));
  const [task, setTask] = React.useState(defaultText(form, 'task') || tasks[0] || '');
  const [maxSteps, setMaxSteps] = React.useState(defaultText(form, 'hyper.max_steps'));
  const [batchSize, setBatchSize] = React.useState(defaultText(form, 'hyper.batch_size'));
  const [auto, setAuto] = React.useState(true);
  const [ticked, setTicked] = React.useState<Set<string>>(new Set());
  // every task's fields, by spec path: a value typed for one task is kept if the user comes back to it
  const [fields, setFields] = React.useState<{ [path: string]: string }>(() => fieldTexts(form));
  const [busy, setBusy] = React.useState(false);
  const [message, setMessage] = React.useState<string | null>(null);
  const [ok, setOk] = React.useState(false);
  const [problems, setProblems] = React.useState<string[]>([]);
  const [price, setPrice] = React.useState('');
  const doctor = model.doctor;
  // the spec the form would launch now: the estimate beside Start follows it
  const spec = requestSpec(form, {
    name,
    model: modelName,
    data: source,
    task,
    maxSteps,
    batchSize,
    auto,
    ticked: [...ticked],
    fields
  });

  const toggle = (toggleName: string, on: boolean) => {
    const next = new Set(ticked);
    if (on) {
      next.add(toggleName);
      // toggles of one spec field exclude each other (one precision at a time)
      for (const other of exclusiveWith(form.toggles, toggleName)) {
        next.delete(other);
      }
    } else {
      next.delete(toggleName);
    }
    setTicked(next);
  };

  const sizeField = (path: string) => (
    <TaskField
      form={form}
      path={path}
      label={SIZE_LABELS[path]}
      text={fields[path] ?? defaultText(form, path)}
      trans={trans}
      onChange={text => setFields({ ...fields, [path]: text })}
    />
  );

  const submit = async (event: React.FormEvent) => {
    event.preventDefault();
    setBusy(true);
    setMessage(null);
    setProblems([]);
    try {
      const launched = await model.launch(spec);
      setOk(true);
      setMessage(trans.__('Started %1', launched.id));
      setName('');
    } catch (error) {
      setOk(false);
      setMessage(describe(error));
      setProblems(error instanceof ApiError ? error.problems : []);
    } finally {
      setBusy(false);
    }
  };

  return (
    // noValidate: the server checks the spec and answers field by field, the same way everywhere in ortlab.
    <form className="ortlab-NewRun" noValidate onSubmit={event => void submit(event)}>
      <div className="ortlab-NewRun-title">{trans.__('New run')}</div>
      <label className="ortlab-Field" title={description(form, 'name')}>
        <span>{trans.__('name (optional)')}</span>
        <input
          className="jp-mod-styled"
          name="name"
          value={name}
          placeholder={trans.__('task, model and time')}
          onChange={e => setName(e.target.value)}
        />
      </label>
      <label className="ortlab-Field" title={description(form, 'model.name')}>
        <span>{trans.__('model')}</span>
        <input
          className="jp-mod-styled"
          name="model"
          value={modelName}
          onChange={e => setModelName(e.target.value)}
        />
      </label>
      <label className="ortlab-Field" title={description(form, 'data.source')}>
        <span>{trans.__('data')}</span>
        <input
          className="jp-mod-styled"
          name="data"
          value={source}
          onChange={e => setSource(e.target.value)}
        />
      </label>
      <label className="ortlab-Field" title={description(form, 'task')}>
        <span>{trans.__('task')}</span>
        <select
          className="jp-mod-styled"
          name="task"
          value={task}
          onChange={e => setTask(e.target.value)}
        >
          {tasks.map(t => (
            <option key={t} value={t}>
              {t}
            </option>
          ))}
        </select>
      </label>
      {taskFields(form, task).length > 0 ? (
        <fieldset className="ortlab-TaskFields" data-task={task}>
          <legend>{trans.__('%1 settings', task)}</legend>
          {taskFields(form, task).map(path => (
            <TaskField
              key={path}
              form={form}
              path={path}
              text={fields[path] ?? defaultText(form, path)}
              trans={trans}
              onChange={text => setFields({ ...fields, [path]: text })}
            />
          ))}
        </fieldset>
      ) : null}
      <div className="ortlab-Field-row">
        <label className="ortlab-Field" title={description(form, 'hyper.max_steps')}>
          <span>{trans.__('max steps')}</span>
          <input
            className="jp-mod-styled"
            name="max_steps"
            type="number"
            min={1}
            value={maxSteps}
            placeholder={trans.__('1 epoch')}
            onChange={e => setMaxSteps(e.target.value)}
          />
        </label>
        <label className="ortlab-Field" title={description(form, 'hyper.batch_size')}>
          <span>{trans.__('batch size')}</span>
          <input
            className="jp-mod-styled"
            name="batch_size"
            type="number"
            min={1}
            value={batchSize}
            onChange={e => setBatchSize(e.target.value)}
          />
        </label>
      </div>
      {/* max length beside the price, then the budget: two to a row, as the sidebar is narrow */}
      <div className="ortlab-Field-row">
        {sizeField('hyper.max_length')}
        <label
          className="ortlab-Field"
          title={trans.__("The price of this machine per hour: the estimate shows the run's cost")}
        >
          <span>{trans.__('price / hour')}</span>
          <input
            className="jp-mod-styled"
            name="price_per_hour"
            type="number"
            min={0}
            step="any"
            value={price}
            placeholder={trans.__('(none)')}
            onChange={e => setPrice(e.target.value)}
          />
        </label>
      </div>
      <div className="ortlab-Field-row">
        {sizeField('budget.minutes')}
        {sizeField('budget.memory_gb')}
      </div>
      <fieldset className="ortlab-Mix">
        <legend>{trans.__('acceleration mix')}</legend>
        <label className="ortlab-Toggle">
          <input
            type="checkbox"
            name="auto"
            checked={auto}
            onChange={e => setAuto(e.target.checked)}
          />
          <span>{trans.__('auto (what measured fastest here)')}</span>
        </label>
        {form.toggles.map(t => {
          const a = doctor?.accelerations[t.name];
          const unavailable = a !== undefined && !a.available;
          return (
            <label
              key={t.name}
              className={`ortlab-Toggle ${unavailable ? 'ortlab-Toggle-unavailable' : ''}`}
              title={a?.reason ?? ''}
            >
              <input
                type="checkbox"
                name={t.name}
                disabled={auto || unavailable}
                checked={!auto && ticked.has(t.name)}
                onChange={e => toggle(t.name, e.target.checked)}
              />
              <span>{t.label}</span>
              {unavailable ? (
                <span className="ortlab-Toggle-reason">{a?.reason ?? trans.__('unavailable')}</span>
              ) : a?.slow ? (
                <span className="ortlab-Toggle-reason">{trans.__('slower here')}</span>
              ) : null}
            </label>
          );
        })}
      </fieldset>
      {message ? (
        <div className={ok ? 'ortlab-Ok' : 'ortlab-Error'} role="status">
          {message}
        </div>
      ) : null}
      {problems.length > 0 ? (
        <ul className="ortlab-Problems">
          {problems.map((p, i) => (
            <li key={i}>{p}</li>
          ))}
        </ul>
      ) : null}
      <div className="ortlab-NewRun-actions">
        <button type="button" className="jp-mod-styled jp-mod-reject" onClick={props.onClose}>
          {trans.__('Close')}
        </button>
        <button type="submit" className="jp-mod-styled jp-mod-accept ortlab-Launch" disabled={busy}>
          {busy ? trans.__('Starting…') : trans.__('Start run')}
        </button>
      </div>
      <EstimateLine spec={spec} price={price} trans={trans} />
    </form>
  );
}

/** The size fields' labels (the workbench's words); their tooltips are the spec's descriptions. */
const SIZE_LABELS: { [path: string]: string } = {
  'hyper.max_length': 'max length',
  'budget.minutes': 'budget, min',
  'budget.memory_gb': 'budget, GB'
};

/**
 * One of a task's form fields (its record names them, `tasks` in `GET spec`), drawn from its schema: a select for
 * a closed set, a checkbox for a boolean, a number or a text input otherwise. Its input's name is the spec path.
 */
function TaskField(props: {
  form: ISpecForm;
  path: string;
  label?: string;
  text: string;
  trans: TranslationBundle;
  onChange(text: string): void;
}): JSX.Element {
  const { form, path, text, trans } = props;
  const input = fieldInput(form, path);
  const label = props.label ?? (path.split('.').pop() ?? path).replace(/_/g, ' ');
  const title = description(form, path);
  if (input?.kind === 'boolean') {
    return (
      <label className="ortlab-Toggle ortlab-TaskField" title={title}>
        <input
          type="checkbox"
          name={path}
          checked={text === 'true'}
          onChange={e => props.onChange(e.target.checked ? 'true' : 'false')}
        />
        <span>{label}</span>
      </label>
    );
  }
  let control: JSX.Element;
  if (input?.kind === 'choice') {
    control = (
      <select
        className="jp-mod-styled"
        name={path}
        value={text}
        onChange={e => props.onChange(e.target.value)}
      >
        {input.nullable ? <option value="">{trans.__('(none)')}</option> : null}
        {input.choices.map(c => (
          <option key={c} value={c}>
            {c}
          </option>
        ))}
      </select>
    );
  } else {
    const numeric = input?.kind === 'number' || input?.kind === 'integer';
    control = (
      <input
        className="jp-mod-styled"
        name={path}
        type={numeric ? 'number' : 'text'}
        step={input?.kind === 'number' ? 'any' : undefined}
        value={text}
        placeholder={input?.nullable ? trans.__('(none)') : undefined}
        onChange={e => props.onChange(e.target.value)}
      />
    );
  }
  return (
    <label className="ortlab-Field ortlab-TaskField" title={title}>
      <span>{label}</span>
      {control}
    </label>
  );
}
