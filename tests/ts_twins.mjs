// The sidebar's TypeScript ports run on shared cases; tests/test_ts_twins.py compares what they answer with
// their Python twins. Usage: node tests/ts_twins.mjs <extension folder> <cases.json>  (answers JSON on stdout)
//
// The sources are transpiled with the extension's own `typescript` (its node_modules) into a temporary folder
// and imported as they are: no build, no browser. Only modules without runtime imports can be loaded this way
// (specform.ts imports types only, which transpiling drops).
import fs from 'node:fs';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';
import url from 'node:url';

const [extension, casesPath] = process.argv.slice(2);
const ts = createRequire(path.join(path.resolve(extension), 'package.json'))('typescript');
const out = fs.mkdtempSync(path.join(os.tmpdir(), 'ortlab-ts-twins-'));

async function load(name) {
  const source = fs.readFileSync(path.join(extension, 'src', `${name}.ts`), 'utf8');
  const { outputText } = ts.transpileModule(source, {
    compilerOptions: { module: ts.ModuleKind.ES2020, target: ts.ScriptTarget.ES2020 },
    fileName: `${name}.ts`
  });
  if (/^\s*import\s/m.test(outputText)) {
    throw new Error(`${name}.ts imports a module at run time: this runner loads it alone`);
  }
  const file = path.join(out, `${name}.mjs`);
  fs.writeFileSync(file, outputText);
  return import(url.pathToFileURL(file).href);
}

try {
  const cases = JSON.parse(fs.readFileSync(casesPath, 'utf8'));
  const specform = await load('specform');
  const series = await load('series');
  const estimatetext = await load('estimatetext');
  const toggles = cases.toggles.list; // as the server sends them (GET spec)

  const exclusive = Object.fromEntries(toggles.map(t => [t.name, specform.exclusiveWith(toggles, t.name)]));
  // A click as the New run form handles it (panel.tsx): ticking unticks the toggles exclusive with it.
  const clicks = cases.toggles.clicks.map(sequence => {
    const ticked = new Set();
    for (const click of sequence) {
      if (click.startsWith('-')) {
        ticked.delete(click.slice(1));
      } else {
        ticked.add(click);
        specform.exclusiveWith(toggles, click).forEach(other => ticked.delete(other));
      }
    }
    const values = Object.fromEntries(specform.toggleValues(toggles, ticked));
    return { ticked: [...ticked].sort(), values };
  });
  const ticked = cases.toggles.ticked.map(names =>
    Object.fromEntries(specform.toggleValues(toggles, new Set(names)))
  );

  // A step record at a time, as model.ts reads them (drawnValues: NaN where a number is missing).
  const drawn = cases.series.map(c => {
    const s = series.emptySeries();
    c.steps.forEach((step, i) => {
      const record = { event: 'step', step, loss: c.loss[i], samples_per_s: c.samples_per_s[i] };
      const [loss, samplesPerS] = series.drawnValues(record);
      series.addPoint(s, step, loss, samplesPerS, c.max_points);
    });
    const json = values => values.map(v => (Number.isFinite(v) ? v : null));
    return { steps: s.steps, loss: json(s.loss), samples_per_s: json(s.samplesPerS) };
  });

  // The New run form (panel.tsx): every task's fields from the server's task list, drawn from the schema, and the
  // spec it posts, from the inputs as the form holds them (their defaults, then what the case typed).
  const form = cases.form; // GET spec, as the server sends it
  const tasks = specform.choices(form, 'task');
  const taskFields = Object.fromEntries(tasks.map(t => [t, specform.taskFields(form, t)]));
  const paths = [...new Set([...specform.SIZE_FIELDS, ...Object.values(taskFields).flat()])];
  const inputs = Object.fromEntries(paths.map(p => [p, specform.fieldInput(form, p)]));
  const newRun = (run, fields) => ({
    name: '',
    model: specform.defaultText(form, 'model.name'),
    data: specform.defaultText(form, 'data.source'),
    maxSteps: '',
    batchSize: '',
    auto: true,
    ticked: [],
    ...run,
    fields: { ...specform.fieldTexts(form), ...fields }
  });
  const requests = cases.requests.map(c => specform.requestSpec(form, newRun(c.run, c.fields)));
  const taskDefaults = Object.fromEntries(
    tasks.map(t => [t, specform.requestSpec(form, newRun({ task: t }, {}))])
  );

  process.stdout.write(
    JSON.stringify({
      exclusive,
      clicks,
      ticked,
      drawn_fields: series.DRAWN,
      series: drawn,
      task_fields: taskFields,
      inputs,
      requests,
      task_defaults: taskDefaults,
      size_fields: specform.SIZE_FIELDS,
      // The estimate's numbers as the line beside Start writes them (estimatetext.ts).
      mib: cases.estimate_text.mib.map(estimatetext.mib),
      duration: cases.estimate_text.seconds.map(estimatetext.duration)
    })
  );
} finally {
  fs.rmSync(out, { recursive: true, force: true });
}
