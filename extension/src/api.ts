/**
 * The REST contract of ortlab's server extension (`<base_url>/ortlab/api/...`), typed, and one helper that
 * calls it. Every request goes through `ServerConnection.makeRequest`, which adds the token and the XSRF
 * header that jupyter_server checks: the sidebar never handles credentials itself.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** One run as the runs list gives it. */
export interface IRunRow {
  id: string;
  state: string;
  step: number;
  max_steps: number | null;
  samples_per_s: number | null;
  loss: number | null;
  requested: string[];
  applied: string[];
  not_applied: string[];
  updated: number | string | null;
  /** Training processes (Ray Train workers on a cluster); 1 for most runs. */
  world_size?: number;
  /** Worker groups restarted after a worker failed (Ray Train runs). */
  restarts?: number;
  /** Why a failed run failed, or why a damaged folder is not trusted (its text comes from the folder). */
  error?: string | null;
}

export interface IRunsList {
  root: string;
  runs: IRunRow[];
}

/**
 * One record of a run's metrics.jsonl. What each event's record holds is the server's (`ISpecForm.records`,
 * from ortlab.runfolder.records); the fields the sparklines draw are series.ts's `DRAWN`.
 */
export interface IMetricRecord {
  event?: string;
  step?: number;
  [key: string]: unknown;
}

/** One field of a metrics record (ortlab.runfolder.records.Field). */
export interface IRecordField {
  name: string;
  /** Its JSON type: int, float, str, bool, object, list. */
  type: string;
  /** What its number counts (s, MB, 1/s, ...), or ''. */
  unit: string;
  doc: string;
  /** When it is written ('': in every record of its event). */
  when: string;
  /** The views that draw it: 'charts' (the workbench), 'sidebar' (the sparklines). */
  drawn: string[];
  title: string;
}

/** What one event's metrics record holds (ortlab.runfolder.records.Record). */
export interface IRecordSchema {
  event: string;
  doc: string;
  fields: IRecordField[];
  /** Any other field named with this prefix belongs too ('eval_'), or ''. */
  prefix: string;
  /** Why the record may hold fields not listed, or '' (it holds only these). */
  open: string;
}

export interface IMetricsPage {
  records: IMetricRecord[];
  offset: number;
}

export interface IAcceleration {
  available: boolean;
  reason?: string | null;
  remedy?: string | null;
  slow?: boolean | null;
}

export interface IDoctor {
  probed: boolean;
  accelerations: { [name: string]: IAcceleration };
}

/** A node of RunSpec's JSON schema as pydantic writes it (only the keys the form reads are typed). */
export interface ISchemaNode {
  $ref?: string;
  anyOf?: ISchemaNode[];
  enum?: unknown[];
  const?: unknown;
  type?: string;
  description?: string;
  default?: unknown;
  exclusiveMinimum?: number;
  properties?: { [name: string]: ISchemaNode };
}

/**
 * One acceleration toggle (ortlab.toggles): the doctor's name for it, its label, and the spec field it sets
 * (`path`): `on` when ticked, `off` when no toggle of that field is.
 */
export interface IToggle {
  name: string;
  label: string;
  path: string;
  on: unknown;
  off: unknown;
}

/**
 * One task as the forms see it (ortlab.tasks.Task.to_dict): its name, one line about it, and the spec fields
 * (dotted paths) its form shows, in order.
 */
export interface ITaskForm {
  name: string;
  description: string;
  form: string[];
}

/**
 * `GET spec`: RunSpec's JSON schema, a default spec, the acceleration toggles and each task's form fields, from
 * which the New run form is built; and what each metrics record holds.
 */
export interface ISpecForm {
  schema: ISchemaNode & { $defs?: { [name: string]: ISchemaNode } };
  defaults: { [name: string]: unknown };
  toggles: IToggle[];
  tasks: ITaskForm[];
  records: IRecordSchema[];
}

export interface ILaunched {
  id: string;
  path: string;
}

/** A refused request: the server's message, and for a bad RunSpec the field-by-field problems. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly problems: string[] = []
  ) {
    super(message);
  }
}

/** The prefix of every route; the server extension registers its handlers under it. */
export const API_PREFIX = 'ortlab/api';

/**
 * Call one route. Answers the parsed JSON body, or throws an ApiError with the server's message
 * (a 404 on the runs list means the server extension is not enabled: the message says so).
 */
export async function requestAPI<T>(
  endPoint: string,
  init: RequestInit = {},
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<T> {
  const url = URLExt.join(settings.baseUrl, API_PREFIX, endPoint);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new ApiError(0, `the Jupyter server cannot be reached (${String(error)})`);
  }
  const text = await response.text();
  let body: unknown = null;
  if (text.length > 0) {
    try {
      body = JSON.parse(text);
    } catch {
      body = null;
    }
  }
  if (!response.ok) {
    const data = (body ?? {}) as { message?: unknown; problems?: unknown };
    const problems = Array.isArray(data.problems) ? data.problems.map(p => String(p)) : [];
    let message = typeof data.message === 'string' ? data.message : response.statusText;
    if (response.status === 404 && endPoint === 'runs' && !init.method) {
      message =
        "ortlab's server extension does not answer: enable it with " +
        '`jupyter server extension enable ortlab` and restart JupyterLab';
    }
    throw new ApiError(response.status, message || `HTTP ${response.status}`, problems);
  }
  return body as T;
}

/** A run id as one URL path segment (ids are folder names; the server refuses anything else anyway). */
export function runPath(id: string, ...rest: string[]): string {
  return ['runs', encodeURIComponent(id), ...rest].join('/');
}

/** One term of an estimate (ortlab.estimator.terms.Term): its value with its range, and what it rests on. */
export interface IEstimateTerm {
  name: string;
  value: number;
  low: number;
  high: number;
  basis: string;
  note: string;
}

/**
 * `POST estimate`: the estimate of the spec the form would launch (ortlab.estimator.Estimate.to_dict, the keys the
 * sidebar reads), with a budget of the spec fitted to it (`fitted`: what the fit changes), and `refusal`: what
 * Launch would answer when the run cannot fit here (the numbers and the remedies), else null.
 */
export interface IEstimate {
  device: string;
  peak_mem_mb: IEstimateTerm;
  available_mb: number | null;
  fits: boolean | null;
  memory: IEstimateTerm[];
  step_time_s: IEstimateTerm;
  steps: number | null;
  total_time_s: IEstimateTerm | null;
  cost: number | null;
  fitted: string[];
  refusal: string | null;
}
