/**
 * RunSpec's fields as the New run form shows them, read from the schema the server sends (`GET spec`): the
 * choices of a field (every task the spec knows, seq2seq included), its default and its description come from
 * ortlab's own RunSpec, never from a copy here that would lag it. Which fields a task shows is its record's
 * (`tasks` in `GET spec`, ortlab.tasks.Task.form), so a new task needs no change here.
 */
import { ISchemaNode, ISpecForm, IToggle } from './api';

/** The schema node of a dotted field path ("hyper.batch_size"), or null when the spec has no such field. */
export function fieldNode(form: ISpecForm, path: string): ISchemaNode | null {
  let node: ISchemaNode | undefined = form.schema;
  for (const part of path.split('.')) {
    node = deref(form, node)?.properties?.[part];
    if (node === undefined) {
      return null;
    }
  }
  return node ? deref(form, node) : null;
}

function deref(form: ISpecForm, node: ISchemaNode): ISchemaNode {
  if (!node.$ref) {
    return node;
  }
  const name = node.$ref.split('/').pop() ?? '';
  const own: ISchemaNode = { ...node }; // the referring property's own keys (its description) win
  delete own.$ref;
  return { ...(form.schema.$defs?.[name] ?? {}), ...own };
}

/** The values a field allows when they are a closed set (an enum, a Literal), as strings; [] otherwise. */
export function choices(form: ISpecForm, path: string): string[] {
  const node = fieldNode(form, path);
  if (node === null) {
    return [];
  }
  const values: unknown[] = [];
  for (const branch of node.anyOf ?? [node]) {
    if (Array.isArray(branch.enum)) {
      values.push(...branch.enum);
    } else if (branch.const !== undefined) {
      values.push(branch.const);
    }
  }
  return values.map(v => String(v));
}

/** The field's description (the form's tooltip), or ''. */
export function description(form: ISpecForm, path: string): string {
  return fieldNode(form, path)?.description ?? '';
}

/** The field's value in the default spec (which holds the defaults a schema cannot: factory-built sections). */
export function defaultOf(form: ISpecForm, path: string): unknown {
  let value: unknown = form.defaults;
  for (const part of path.split('.')) {
    if (value === null || typeof value !== 'object' || Array.isArray(value)) {
      return undefined;
    }
    value = (value as { [name: string]: unknown })[part];
  }
  return value;
}

/** The default as the text of an input: '' for none. */
export function defaultText(form: ISpecForm, path: string): string {
  const value = defaultOf(form, path);
  return value === null || value === undefined ? '' : String(value);
}

/** Set a dotted path of a spec object, making the sections on the way. */
export function setPath(spec: { [name: string]: unknown }, path: string, value: unknown): void {
  const parts = path.split('.');
  const last = parts.pop() ?? '';
  let node = spec;
  for (const part of parts) {
    const next = node[part];
    if (next === null || typeof next !== 'object' || Array.isArray(next)) {
      node[part] = {};
    }
    node = node[part] as { [name: string]: unknown };
  }
  node[last] = value;
}

/**
 * The spec fields (by dotted path) the acceleration toggles say when the toggles named in `ticked` are ticked:
 * each field the `on` of its first ticked toggle, else its `off` (ortlab.toggles.field_values, the same rule).
 */
export function toggleValues(toggles: IToggle[], ticked: Set<string>): Map<string, unknown> {
  const values = new Map<string, unknown>();
  for (const t of toggles) {
    if (ticked.has(t.name) && !values.has(t.path)) {
      values.set(t.path, t.on);
    }
  }
  for (const t of toggles) {
    if (!values.has(t.path)) {
      values.set(t.path, t.off);
    }
  }
  return values;
}

/** The toggles that ticking `name` unticks: the others that set the same spec field (fp16 and bf16). */
export function exclusiveWith(toggles: IToggle[], name: string): string[] {
  const path = toggles.find(t => t.name === name)?.path;
  return toggles.filter(t => t.path === path && t.name !== name).map(t => t.name);
}

/** The spec fields (dotted paths) the form shows for `task`, in its record's order; [] for a task it does not know. */
export function taskFields(form: ISpecForm, task: string): string[] {
  return form.tasks.find(t => t.name === task)?.form ?? [];
}

/**
 * How a field is drawn: `choice` a select (an enum, a Literal, `bool | "auto"`), `boolean` a checkbox, `number`
 * and `integer` a number input, `text` a text input.
 */
export type FieldKind = 'choice' | 'boolean' | 'number' | 'integer' | 'text';

/** One field as the form draws it (ortlab.specfields.FieldDoc's twin: choices, nullable, from the schema). */
export interface IFieldInput {
  path: string;
  kind: FieldKind;
  /** The closed set of values, as text (the booleans of `bool | "auto"` too); [] when not a choice. */
  choices: string[];
  /** null is allowed: an empty input sends null (`SpecFields.value`'s rule). */
  nullable: boolean;
  /** A number that must be > 0 but may be null: 0 is sent as null, as the workbench does. */
  zeroIsUnset: boolean;
}

/** A field of the spec as an input, or null when the spec has no such field. */
export function fieldInput(form: ISpecForm, path: string): IFieldInput | null {
  const node = fieldNode(form, path);
  if (node === null) {
    return null;
  }
  const branches = node.anyOf ?? [node];
  const values: string[] = [];
  const types = new Set<string>();
  let nullable = false;
  let positive = false;
  for (const branch of branches) {
    if (branch.type === 'null') {
      nullable = true;
      continue;
    }
    if (Array.isArray(branch.enum)) {
      values.push(...branch.enum.map(v => String(v)));
    } else if (branch.const !== undefined) {
      values.push(String(branch.const));
    } else if (branch.type === 'boolean' && branches.length > 1) {
      values.push('true', 'false'); // bool | "auto": the booleans are choices too
    } else if (branch.type !== undefined) {
      types.add(branch.type);
    }
    if (branch.exclusiveMinimum === 0) {
      positive = true;
    }
  }
  let kind: FieldKind = 'text';
  if (values.length > 0) {
    kind = 'choice';
  } else if (types.has('boolean')) {
    kind = 'boolean';
  } else if (types.has('integer') && !types.has('number')) {
    kind = 'integer';
  } else if (types.has('number')) {
    kind = 'number';
  }
  return { path, kind, choices: values, nullable, zeroIsUnset: positive && nullable };
}

/**
 * The fields every task's form shows beside max steps and batch size, which the estimate beside Start follows: the
 * longest row in tokens, and the budget the launch fits the run to (ortlab.estimator.budget; 0 or empty: none),
 * as the workbench's form has them (the sidebar draws them under max steps and batch size).
 */
export const SIZE_FIELDS = ['hyper.max_length', 'budget.minutes', 'budget.memory_gb'];

/** Every task's form fields (and SIZE_FIELDS) with their defaults as their inputs' text ('true'/'false' for a checkbox). */
export function fieldTexts(form: ISpecForm): { [path: string]: string } {
  const texts: { [path: string]: string } = {};
  for (const path of SIZE_FIELDS) {
    texts[path] = defaultText(form, path);
  }
  for (const t of form.tasks) {
    for (const path of t.form) {
      texts[path] = defaultText(form, path);
    }
  }
  return texts;
}

/**
 * An input's text as the spec field wants it (`ortlab.specfields.SpecFields.value`, the same rule): stripped; an
 * empty text of a nullable field (or the 0 of a nullable positive number) is null; a number is parsed (a text
 * that is not one is sent as it is, so the server names the field); a choice is its value of the schema (true,
 * not 'true'). undefined: nothing to send (an empty text of a field that cannot be null keeps its default).
 */
export function fieldValue(form: ISpecForm, path: string, text: string): unknown {
  const input = fieldInput(form, path);
  const raw = text.trim();
  if (input === null) {
    return raw;
  }
  if (raw === '') {
    return input.nullable ? null : undefined;
  }
  if (input.kind === 'boolean') {
    return raw === 'true';
  }
  if (input.kind === 'choice') {
    return raw === 'true' ? true : raw === 'false' ? false : raw;
  }
  if (input.kind === 'number' || input.kind === 'integer') {
    const value = Number(raw);
    if (!Number.isFinite(value)) {
      return raw;
    }
    return input.zeroIsUnset && value === 0 ? null : value;
  }
  return raw;
}

/** What the New run form holds when it is sent. */
export interface INewRun {
  name: string;
  model: string;
  data: string;
  task: string;
  maxSteps: string;
  batchSize: string;
  /** `auto`: every acceleration choice left to ortlab's measurement; else the ticked toggles say them. */
  auto: boolean;
  ticked: string[];
  /** The task fields' texts by path (every task's: only the chosen task's are sent). */
  fields: { [path: string]: string };
}

/**
 * The RunSpec the form posts (`POST runs`). Only the chosen task's fields are sent: a spec keeps only what its
 * task reads (RunSpec refuses another task's settings, such as `preference` with causal-lm), so values typed
 * for a task chosen before do not follow; SIZE_FIELDS are every task's.
 */
export function requestSpec(form: ISpecForm, run: INewRun): { [name: string]: unknown } {
  const spec: { [name: string]: unknown } = {
    task: run.task,
    model: { name: run.model.trim() },
    data: { source: run.data.trim() },
    accel: {}
  };
  if (!run.auto) {
    for (const [path, value] of toggleValues(form.toggles, new Set(run.ticked))) {
      setPath(spec, path, value);
    }
  }
  if (run.name.trim()) {
    spec.name = run.name.trim();
  }
  const hyper: { [name: string]: unknown } = {};
  if (run.maxSteps.trim()) hyper.max_steps = Number(run.maxSteps);
  if (run.batchSize.trim()) hyper.batch_size = Number(run.batchSize);
  spec.hyper = hyper;
  for (const path of [...SIZE_FIELDS, ...taskFields(form, run.task)]) {
    const value = fieldValue(form, path, run.fields[path] ?? defaultText(form, path));
    if (value !== undefined) {
      setPath(spec, path, value);
    }
  }
  return spec;
}
