/**
 * A sparkline's points: the whole run, at a bounded number of points whatever its length (issue #35).
 *
 * The points are not evenly spread over the run's steps: its history arrives downsampled by the server (a few
 * hundred points for tens of thousands of steps), while a live run adds every step. So when the series grows
 * past twice `maxPoints`, it is put in `maxPoints / 2` buckets of equal width IN STEPS (not of equal counts of
 * points: that would leave the history ever coarser than the tail as the run goes on, and the first steps would
 * fade away), and each bucket keeps two points: for each drawn number (loss and samples/s alike), its minimum
 * and its maximum, in the order they came. A loss spike or a stall in samples/s survives, so the line keeps its
 * shape; the two points carry the bucket's first and last step, so steps stay increasing and the run's first step
 * stays the first point. The newest point is kept as it is (its value is written beside the line).
 *
 * Afterwards at most `maxPoints + 1` points remain, so a coarsening (O(maxPoints)) comes at most once every
 * `maxPoints` new points: the work per poll is bounded, and the same for a run of 100 or 100,000 steps.
 */

/**
 * The step record fields the sparklines draw, in the order of ISeries' columns (loss, samplesPerS): the fields
 * ortlab.runfolder.records marks drawn in the sidebar (tests/test_ts_twins.py holds the two to each other), whose
 * extremes the server's downsampling keeps.
 */
export const DRAWN = ['loss', 'samples_per_s'] as const;

/** A step record's drawn numbers, in DRAWN's order (NaN where the record has none). */
export function drawnValues(record: { [key: string]: unknown }): number[] {
  return DRAWN.map(name => {
    const value = record[name];
    return typeof value === 'number' ? value : NaN;
  });
}

export interface ISeries {
  steps: number[];
  loss: number[];
  samplesPerS: number[];
}

export function emptySeries(): ISeries {
  return { steps: [], loss: [], samplesPerS: [] };
}

/**
 * Add one step's numbers (NaN where a record has none). A resumed run starts again from its checkpoint's step:
 * the points at or after it go, so the curve stays monotonic in steps (of a coarsened bucket that straddles the
 * step, its earlier point stays).
 */
export function addPoint(
  s: ISeries,
  step: number,
  loss: number,
  samplesPerS: number,
  maxPoints: number
): void {
  while (s.steps.length > 0 && s.steps[s.steps.length - 1] >= step) {
    s.steps.pop();
    s.loss.pop();
    s.samplesPerS.pop();
  }
  s.steps.push(step);
  s.loss.push(loss);
  s.samplesPerS.push(samplesPerS);
  if (s.steps.length > 2 * maxPoints) {
    coarsen(s, maxPoints);
  }
}

/** Down to at most `maxPoints + 1` points (see the module's comment for the scheme and why). */
export function coarsen(s: ISeries, maxPoints: number): void {
  const n = s.steps.length - 1; // the newest point stays as it is
  if (n < 2) {
    return;
  }
  const buckets = Math.max(1, Math.floor(maxPoints / 2));
  const first = s.steps[0];
  const width = (s.steps[n - 1] - first) / buckets;
  const bucketOf = (i: number) =>
    width > 0 ? Math.min(buckets - 1, Math.floor((s.steps[i] - first) / width)) : 0;
  const out = emptySeries();
  let i = 0;
  while (i < n) {
    let j = i + 1;
    while (j < n && bucketOf(j) === bucketOf(i)) {
      j++;
    }
    if (j - i <= 2) {
      out.steps.push(...s.steps.slice(i, j));
      out.loss.push(...s.loss.slice(i, j));
      out.samplesPerS.push(...s.samplesPerS.slice(i, j));
    } else {
      out.steps.push(s.steps[i], s.steps[j - 1]);
      out.loss.push(...extremes(s.loss, i, j));
      out.samplesPerS.push(...extremes(s.samplesPerS, i, j));
    }
    i = j;
  }
  s.steps = [...out.steps, s.steps[n]];
  s.loss = [...out.loss, s.loss[n]];
  s.samplesPerS = [...out.samplesPerS, s.samplesPerS[n]];
}

/** The minimum and the maximum of `values[from..to)` in the order they came (NaN, NaN when none is finite). */
function extremes(values: number[], from: number, to: number): [number, number] {
  let lo = -1;
  let hi = -1;
  for (let k = from; k < to; k++) {
    const v = values[k];
    if (!Number.isFinite(v)) {
      continue;
    }
    if (lo < 0 || v < values[lo]) {
      lo = k;
    }
    if (hi < 0 || v > values[hi]) {
      hi = k;
    }
  }
  if (lo < 0) {
    return [NaN, NaN];
  }
  return lo <= hi ? [values[lo], values[hi]] : [values[hi], values[lo]];
}
