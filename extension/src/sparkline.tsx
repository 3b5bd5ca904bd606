import * as React from 'react';

export interface ISparklineProps {
  /** What the line shows (read by screen readers and shown beside the line). */
  label: string;
  values: number[];
  /** The step of each value: x is drawn by step (the points are not evenly spread, see series.ts). */
  steps: number[];
  /** How the latest value is written next to the line. */
  format: (value: number) => string;
  className?: string;
}

const WIDTH = 120;
const HEIGHT = 22;

/**
 * A tiny inline SVG line of a series over its steps (NaN values are skipped). The colour comes from the theme through
 * CSS (`stroke: currentColor`), so it reads in light and dark themes alike.
 */
export function Sparkline(props: ISparklineProps): JSX.Element {
  const finite = props.values.filter(v => Number.isFinite(v));
  const latest = finite.length > 0 ? finite[finite.length - 1] : null;
  let points = '';
  if (finite.length > 0) {
    const lo = Math.min(...finite);
    const hi = Math.max(...finite);
    const height = hi - lo || 1;
    const first = props.steps[0];
    const span = props.steps[props.steps.length - 1] - first;
    const xs = (i: number) => (span > 0 ? ((props.steps[i] - first) / span) * WIDTH : WIDTH / 2);
    const ys = (v: number) => HEIGHT - 2 - ((v - lo) / height) * (HEIGHT - 4);
    points = props.values
      .map((v, i) => (Number.isFinite(v) ? `${xs(i).toFixed(1)},${ys(v).toFixed(1)}` : ''))
      .filter(p => p.length > 0)
      .join(' ');
  }
  // What the line covers, for tests and benchmarks to read from the page.
  return (
    <div
      className={`ortlab-Sparkline ${props.className ?? ''}`}
      data-points={finite.length}
      data-first-step={props.steps.length > 0 ? props.steps[0] : undefined}
      data-last-step={props.steps.length > 0 ? props.steps[props.steps.length - 1] : undefined}
    >
      <span className="ortlab-Sparkline-label">{props.label}</span>
      <svg
        className="ortlab-Sparkline-svg"
        viewBox={`0 0 ${WIDTH} ${HEIGHT}`}
        preserveAspectRatio="none"
        role="img"
        aria-label={props.label}
      >
        {finite.length > 1 ? (
          <polyline points={points} fill="none" vectorEffect="non-scaling-stroke" />
        ) : finite.length === 1 ? (
          <circle cx={WIDTH / 2} cy={HEIGHT / 2} r={1.5} />
        ) : null}
      </svg>
      <span className="ortlab-Sparkline-value">{latest === null ? '–' : props.format(latest)}</span>
    </div>
  );
}
