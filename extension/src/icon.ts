import { LabIcon } from '@jupyterlab/ui-components';

/** The sidebar's tab icon: a rising training curve. `jp-icon3` makes it follow the theme's icon colour. */
const svgstr = `<svg xmlns="http://www.w3.org/2000/svg" width="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M3 3h2v16h16v2H3z"/>
    <path d="M7 16.6l4.3-5.2 3 2.6 4.9-6.6 1.6 1.2-6.2 8.4-3-2.6-3.1 3.7z"/>
    <circle cx="19.5" cy="5.5" r="1.6"/>
  </g>
</svg>`;

export const ortlabIcon = new LabIcon({ name: 'ortlab-sidebar:runs', svgstr });
