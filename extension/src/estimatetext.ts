/**
 * The estimate's numbers as the form shows them, in the same words and units as the workbench's note
 * (ortlab/ui/estimatenote.py `_mib`, `_duration`, `estimate_html`), so both faces say the same thing. Plain text:
 * the view renders it as React text, never as HTML.
 */
import { IEstimate, IEstimateTerm } from './api';

/** MiB, or GiB from 1024 MiB up (estimatenote.py `_mib`). */
export function mib(value: number): string {
  return value >= 1024 ? `${(value / 1024).toFixed(1)} GiB` : `${value.toFixed(0)} MiB`;
}

/** Python's `f"{x:.2g}"` for the positive numbers an estimate has (no exponent below 100). */
function twoDigits(value: number): string {
  return value >= 100 ? value.toFixed(0) : String(Number(value.toPrecision(2)));
}

/** Seconds, minutes or hours (estimatenote.py `_duration`). */
export function duration(seconds: number): string {
  if (seconds < 90) {
    return seconds >= 10 ? `${seconds.toFixed(0)} s` : `${twoDigits(seconds)} s`;
  }
  if (seconds < 5400) {
    return `${(seconds / 60).toFixed(0)} min`;
  }
  return `${(seconds / 3600).toFixed(1)} h`;
}

/** The biggest memory term (what `does not fit` names). */
export function biggest(est: IEstimate): IEstimateTerm | null {
  return est.memory.reduce<IEstimateTerm | null>(
    (a, t) => (a === null || t.value > a.value ? t : a),
    null
  );
}

/** The parts of the estimate's line: peak memory of what is available, step time, whole run, cost. */
export function estimateParts(est: IEstimate): { [part: string]: string } {
  const peak = est.peak_mem_mb;
  let memory = `peak memory ≈ ${mib(peak.value)} (${mib(peak.low)}–${mib(peak.high)})`;
  if (est.available_mb !== null) {
    memory += ` of ${mib(est.available_mb)} available on ${est.device}`;
  }
  const parts: { [part: string]: string } = {
    memory,
    step: `≈ ${twoDigits(est.step_time_s.value)} s/step`
  };
  const total = est.total_time_s;
  if (total !== null) {
    const steps = est.steps === null ? '' : `${est.steps} steps, `;
    parts.total = `${steps}≈ ${duration(total.value)} in all (${duration(total.low)}–${duration(total.high)})`;
  }
  if (est.cost !== null) {
    parts.cost = `cost ≈ ${est.cost.toFixed(2)}`;
  }
  return parts;
}

/** "does not fit: biggest term activations ≈ 80.6 GiB" (estimatenote.py's words), or '' when it fits. */
export function doesNotFit(est: IEstimate): string {
  if (est.fits !== false) {
    return '';
  }
  const big = biggest(est);
  return big === null
    ? 'does not fit'
    : `does not fit: biggest term ${big.name} ≈ ${mib(big.value)}`;
}
