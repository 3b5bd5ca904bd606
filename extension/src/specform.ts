/**
 * RunSpec's fields as the New run form shows them, read from the schema the server sends (`GET spec`): the
 * choices of a field (every task the spec knows, seq2seq included), its default and its description come from
 * ortlab's own RunSpec, never from a copy here that would lag it.
 */
import { ISchemaNode, ISpecForm } from './api';

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
