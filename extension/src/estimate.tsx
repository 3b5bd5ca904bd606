/**
 * The estimate beside the New run form's Start button: predicted peak memory of what this machine has, time per
 * step and for the run, the cost when a price is given, and with a budget what Launch would change to fit it
 * (`POST estimate`: ortlab.estimator, the same answer as the workbench's note; about a second, no weights).
 *
 * It follows the form a moment after the last change (DEBOUNCE_MS: typing a batch size starts one request, not
 * one per keystroke), and a later request wins: an older answer that arrives after a newer one was asked for is
 * dropped. Nothing here blocks the form; an estimate that cannot be made says why in one line. Everything from
 * the server is React text.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { ApiError, IEstimate, requestAPI } from './api';
import { describe } from './model';
import { doesNotFit, estimateParts } from './estimatetext';

/** After the last change of the form, before asking (the workbench note's DEBOUNCE_S). */
export const DEBOUNCE_MS = 400;

type Shown = { state: 'none' } | { state: 'ok'; est: IEstimate } | { state: 'error'; why: string };

/** The request's body: the spec as the form would launch it (its name changes nothing) and the price. */
function requestBody(spec: { [name: string]: unknown }, price: string): string {
  const { name: _name, ...rest } = spec; // eslint-disable-line @typescript-eslint/no-unused-vars
  const text = price.trim();
  const value = text === '' ? null : Number.isFinite(Number(text)) ? Number(text) : text;
  return JSON.stringify({ spec: rest, price_per_hour: value });
}

/** Why there is no estimate, in one line: the server's message, and a bad spec's first problem. */
function why(error: unknown): string {
  const first =
    error instanceof ApiError && error.problems.length > 0 ? `: ${error.problems[0]}` : '';
  return `${describe(error)}${first}`.split('\n')[0];
}

export function EstimateLine(props: {
  spec: { [name: string]: unknown };
  price: string;
  trans: TranslationBundle;
}): JSX.Element {
  const { trans } = props;
  const body = requestBody(props.spec, props.price);
  const [shown, setShown] = React.useState<Shown>({ state: 'none' });
  const [pending, setPending] = React.useState(true);
  const asked = React.useRef(0); // the newest request's number: only its answer is shown

  React.useEffect(() => {
    const mine = ++asked.current;
    setPending(true);
    const timer = window.setTimeout(() => {
      requestAPI<IEstimate>('estimate', { method: 'POST', body })
        .then(est => mine === asked.current && setShown({ state: 'ok', est }))
        .catch(error => mine === asked.current && setShown({ state: 'error', why: why(error) }))
        .finally(() => mine === asked.current && setPending(false));
    }, DEBOUNCE_MS);
    return () => window.clearTimeout(timer);
  }, [body]);
  React.useEffect(
    () => () => {
      asked.current += 1; // closed: an answer still on its way is dropped
    },
    []
  );

  let state: string = shown.state;
  let content: JSX.Element | null = null;
  if (shown.state === 'error') {
    content = (
      <div className="ortlab-Estimate-why" title={shown.why}>
        {trans.__('no estimate: %1', shown.why)}
      </div>
    );
  } else if (shown.state === 'ok') {
    const { est } = shown;
    const parts = estimateParts(est);
    const refused = doesNotFit(est);
    state = refused ? 'nofit' : 'ok';
    content = (
      <>
        {refused ? <div className="ortlab-Estimate-verdict">{refused}</div> : null}
        <div className="ortlab-Estimate-line">
          {Object.entries(parts).map(([part, text], i) => (
            <span key={part} className={`ortlab-Estimate-${part}`}>
              {i > 0 ? ' · ' : ''}
              {text}
            </span>
          ))}
        </div>
        {est.fitted.length > 0 ? (
          <div className="ortlab-Estimate-budget">
            {trans.__('budget: %1', est.fitted.join('; '))}
          </div>
        ) : null}
        {est.refusal ? <div className="ortlab-Estimate-refusal">{est.refusal}</div> : null}
      </>
    );
  }
  return (
    <div
      className={`ortlab-Estimate ortlab-Estimate-${state}`}
      data-state={state}
      data-pending={pending ? 'true' : 'false'}
      aria-live="polite"
    >
      {content ?? <div className="ortlab-Estimate-line">{trans.__('estimating…')}</div>}
    </div>
  );
}
