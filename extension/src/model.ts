/**
 * The sidebar's state: the runs list, the doctor, and for each running run the points of its sparklines.
 * It polls the server while a run is pending or running (metrics are read from the last offset, so each poll
 * carries only new records, and once more after a followed run ends) every `liveInterval` ms or more: the wait
 * adapts so that polling takes at most LIVE_SHARE of the time (see `liveWait`); every `idleInterval` ms
 * otherwise, and not at all while the panel is hidden. Each sparkline draws the whole run at
 * a bounded number of points (series.ts). Views read the state and redraw on `changed`.
 */
import { ISignal, Signal } from '@lumino/signaling';

import {
  ApiError,
  IDoctor,
  ILaunched,
  IMetricRecord,
  IMetricsPage,
  IRunRow,
  IRunsList,
  ISpecForm,
  requestAPI,
  runPath
} from './api';
import { addPoint, drawnValues, emptySeries, ISeries } from './series';

/** A run is live while its process may still write metrics. */
export const LIVE_STATES = new Set(['pending', 'running']);

/**
 * The share of the time a live poll may take (its requests, the server's answer, the panel's render and paint,
 * measured from the first request to the second frame after the update) and the longest wait it may lead to.
 * Why: on a 2-core machine the browser and the server take their CPU from the training run itself; polling
 * every 500 ms cost a 150-step run about 8 % of its samples/s (bench_live_browser, sidebar arm). The workbench's
 * chart adapts the same way (ortlab/ui/livechart.py).
 */
export const LIVE_SHARE = 0.025;
export const LIVE_WAIT_MAX = 5000;

/** The wait before the next live poll, given how long the last one took (ms). */
export function liveWait(pollMs: number, liveInterval: number): number {
  return Math.min(LIVE_WAIT_MAX, Math.max(liveInterval, pollMs / LIVE_SHARE));
}

/** Resolves after the browser has painted what the last update drew (two frames), or after 250 ms when no frame
 * comes (a hidden tab draws none). */
function painted(): Promise<void> {
  return new Promise(resolve => {
    const done = window.setTimeout(resolve, 250);
    requestAnimationFrame(() =>
      requestAnimationFrame(() => {
        window.clearTimeout(done);
        resolve();
      })
    );
  });
}

export type { ISeries } from './series';

interface IFollowed {
  offset: number;
  series: ISeries;
  lastStep: number | null;
  /** Read once after the run ended (its last steps may have come after the poll before). */
  ended: boolean;
}

export interface IModelOptions {
  /** Poll period while something runs (ms). */
  liveInterval: number;
  /** Poll period when nothing runs (ms). */
  idleInterval: number;
  /** Points per sparkline: each draws the whole run in at most twice this many (see series.ts). */
  maxPoints: number;
}

export class RunsModel {
  constructor(options: IModelOptions) {
    this.options = { ...options };
  }

  readonly options: IModelOptions;
  root = '';
  runs: IRunRow[] = [];
  doctor: IDoctor | null = null;
  /** RunSpec's schema and defaults (the New run form is built from them), once loaded. */
  form: ISpecForm | null = null;
  /** How long the last poll took (ms, to its paint) and the wait it led to: shown to tests and benchmarks. */
  lastPollMs = 0;
  wait = 0;
  /** Why the last refresh failed (shown at the top of the panel), or null. */
  error: string | null = null;
  loaded = false;

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get anyLive(): boolean {
    return this.runs.some(r => LIVE_STATES.has(r.state));
  }

  series(id: string): ISeries | null {
    return this._followed.get(id)?.series ?? null;
  }

  /** The newest step the metrics have shown (the runs list may lag it by a poll). */
  latestStep(run: IRunRow): number {
    const seen = this._followed.get(run.id)?.lastStep;
    return seen !== null && seen !== undefined && seen > run.step ? seen : run.step;
  }

  configure(options: Partial<IModelOptions>): void {
    Object.assign(this.options, options);
    this.kick();
  }

  /** Start polling (idempotent). `visible()` tells whether the panel is shown. */
  start(visible: () => boolean): void {
    this._visible = visible;
    if (!this._started) {
      this._started = true;
      void this.loadDoctor();
      void this.loadForm();
      this.kick();
    }
  }

  dispose(): void {
    this._disposed = true;
    window.clearTimeout(this._timer);
    Signal.clearData(this);
  }

  /** Poll now (after an action, or when the panel is shown), then carry on at the usual pace. */
  kick(): void {
    window.clearTimeout(this._timer);
    this._timer = window.setTimeout(() => void this.tick(), 0);
  }

  async loadDoctor(): Promise<void> {
    try {
      this.doctor = await requestAPI<IDoctor>('doctor');
    } catch (error) {
      this.doctor = null;
      this.error = describe(error);
    }
    this._changed.emit();
  }

  /** RunSpec's fields from the server: what the New run form offers is what this ortlab accepts. */
  async loadForm(): Promise<void> {
    try {
      this.form = await requestAPI<ISpecForm>('spec');
    } catch (error) {
      this.form = null;
      this.error = describe(error);
    }
    this._changed.emit();
  }

  async launch(spec: unknown): Promise<ILaunched> {
    const launched = await requestAPI<ILaunched>('runs', {
      method: 'POST',
      body: JSON.stringify(spec)
    });
    this.kick();
    return launched;
  }

  async stop(id: string): Promise<void> {
    await requestAPI(runPath(id, 'stop'), { method: 'POST' });
    this.kick();
  }

  async resume(id: string): Promise<void> {
    await requestAPI(runPath(id, 'resume'), { method: 'POST' });
    this.kick();
  }

  private async tick(): Promise<void> {
    if (this._disposed || this._busy) {
      return;
    }
    const shown = this._visible();
    if (shown) {
      this._busy = true;
      const started = performance.now();
      try {
        await this.refresh();
        await painted();
      } finally {
        this._busy = false;
        this.lastPollMs = performance.now() - started;
      }
    }
    if (!this._disposed) {
      const live = shown && this.anyLive;
      this.wait = live
        ? liveWait(this.lastPollMs, this.options.liveInterval)
        : this.options.idleInterval;
      this._timer = window.setTimeout(() => void this.tick(), Math.max(100, this.wait));
    }
  }

  private async refresh(): Promise<void> {
    try {
      const list = await requestAPI<IRunsList>('runs');
      this.root = list.root;
      this.runs = list.runs;
      this.error = null;
      this.loaded = true;
      // Forget runs that went away; the history of a run that ended stays drawn (it is cheap).
      const ids = new Set(this.runs.map(r => r.id));
      for (const id of [...this._followed.keys()]) {
        if (!ids.has(id)) {
          this._followed.delete(id);
        }
      }
      // Live runs, and a followed run once more after it ended: the steps it wrote after the last poll.
      const toRead = this.runs.filter(
        r => LIVE_STATES.has(r.state) || this._followed.get(r.id)?.ended === false
      );
      await Promise.all(toRead.map(r => this.readMetrics(r.id, !LIVE_STATES.has(r.state))));
    } catch (error) {
      this.error = describe(error);
    }
    this._changed.emit();
  }

  private async readMetrics(id: string, ended: boolean): Promise<void> {
    let followed = this._followed.get(id);
    if (!followed) {
      followed = { offset: 0, series: emptySeries(), lastStep: null, ended: false };
      this._followed.set(id, followed);
    }
    // A long history comes in several pages: read until the server has nothing new (bounded per tick).
    for (let page = 0; page < 20; page++) {
      // The server downsamples a page's steps to this many (min/max per bucket): a long run's history arrives
      // as a few hundred points, not tens of thousands of records, for a sparkline 120 pixels wide.
      const maxPoints = Math.min(20000, Math.max(4, Math.round(this.options.maxPoints)));
      const got = await requestAPI<IMetricsPage>(
        `${runPath(id, 'metrics')}?offset=${encodeURIComponent(String(followed.offset))}` +
          `&max_points=${maxPoints}`
      );
      const before = followed.offset;
      followed.offset = got.offset;
      for (const record of got.records) {
        this.consume(followed, record);
      }
      if (got.records.length === 0 || got.offset === before) {
        followed.ended = ended; // caught up: a run that ended is not read again (unless it runs again)
        return;
      }
    }
  }

  private consume(followed: IFollowed, record: IMetricRecord): void {
    if (record.event !== 'step' || typeof record.step !== 'number') {
      return;
    }
    const [loss, samplesPerS] = drawnValues(record);
    addPoint(
      followed.series,
      record.step,
      loss,
      samplesPerS,
      Math.max(2, Math.round(this.options.maxPoints))
    );
    followed.lastStep = record.step;
  }

  private _changed = new Signal<this, void>(this);
  private _followed = new Map<string, IFollowed>();
  private _timer = 0;
  private _busy = false;
  private _started = false;
  private _disposed = false;
  private _visible: () => boolean = () => true;
}

/** One line for the panel from anything a request threw. */
export function describe(error: unknown): string {
  if (error instanceof ApiError) {
    return error.message;
  }
  return error instanceof Error ? error.message : String(error);
}
