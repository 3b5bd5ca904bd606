/**
 * RunSpec's fields as the New run form shows them, read from the schema the server sends (`GET spec`): the
 * choices of a field (every task the spec knows, seq2seq included), its default and its description come from
 * ortlab's own RunSpec, never from a copy here that would lag it.
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
