"use strict";(self.rspackChunkortlab_sidebar=self.rspackChunkortlab_sidebar||[]).push([[232],{475(r,o,e){var a=e(601),t=e.n(a),l=e(314),i=(e.n(l))()(t());i.push([r.id,`/*
 * ortlab sidebar. Only JupyterLab's theme variables: the panel follows the light and dark themes (and any
 * other theme) without colours of its own.
 */

.ortlab-Sidebar {
  background: var(--jp-layout-color1);
  color: var(--jp-ui-font-color1);
  font-family: var(--jp-ui-font-family);
  font-size: var(--jp-ui-font-size1);
  overflow-y: auto;
  min-width: 240px;
}

.ortlab-Sidebar-body {
  display: flex;
  flex-direction: column;
  gap: 6px;
  padding: 4px 8px 12px;
}

.ortlab-Sidebar-header {
  display: flex;
  align-items: center;
  gap: 2px;
  border-bottom: var(--jp-border-width) solid var(--jp-border-color2);
  padding-bottom: 4px;
}

.ortlab-Sidebar-title {
  flex: 1 1 auto;
  margin: 0;
  font-size: var(--jp-ui-font-size0);
  font-weight: 600;
  letter-spacing: 1px;
  text-transform: uppercase;
  color: var(--jp-ui-font-color1);
}

.ortlab-Sidebar-root,
.ortlab-Doctor-note,
.ortlab-Empty {
  color: var(--jp-ui-font-color2);
  font-size: var(--jp-ui-font-size0);
  overflow: hidden;
  text-overflow: ellipsis;
  white-space: nowrap;
  margin: 0;
}

.ortlab-Empty,
.ortlab-Doctor-note {
  white-space: normal;
}

.ortlab-Error {
  color: var(--jp-error-color1);
  background: var(--jp-layout-color2);
  border-left: 3px solid var(--jp-error-color1);
  padding: 4px 6px;
  overflow-wrap: anywhere;
}

.ortlab-Ok {
  color: var(--jp-success-color1);
  overflow-wrap: anywhere;
}

/* doctor */

.ortlab-Doctor-line {
  display: flex;
  flex-wrap: wrap;
  align-items: center;
  gap: 3px;
}

.ortlab-Doctor-title {
  color: var(--jp-ui-font-color2);
  margin-right: 2px;
}

.ortlab-Doctor-details summary {
  cursor: pointer;
  color: var(--jp-ui-font-color2);
  font-size: var(--jp-ui-font-size0);
}

.ortlab-Doctor-details ul {
  margin: 2px 0 0;
  padding-left: 16px;
  font-size: var(--jp-ui-font-size0);
  color: var(--jp-ui-font-color1);
  overflow-wrap: anywhere;
}

.ortlab-Doctor-remedy {
  color: var(--jp-ui-font-color2);
}

/* chips and badges */

.ortlab-Chip,
.ortlab-Badge {
  display: inline-block;
  padding: 0 5px;
  border-radius: var(--jp-border-radius);
  font-size: var(--jp-ui-font-size0);
  line-height: 16px;
  white-space: nowrap;
  border: var(--jp-border-width) solid var(--jp-border-color2);
  color: var(--jp-ui-font-color1);
  background: var(--jp-layout-color2);
}

.ortlab-Chip-ok,
.ortlab-Chip-applied {
  border-color: var(--jp-success-color1);
}

.ortlab-Chip-no {
  color: var(--jp-ui-font-color3);
  text-decoration: line-through;
}

.ortlab-Chip-slow,
.ortlab-Chip-requested {
  border-style: dashed;
  color: var(--jp-ui-font-color2);
}

.ortlab-Chip-plain {
  color: var(--jp-ui-font-color2);
}

.ortlab-Badge {
  font-weight: 600;
  text-transform: uppercase;
  letter-spacing: 0.5px;
  color: var(--jp-ui-inverse-font-color1);
  background: var(--jp-layout-color4);
  border-color: transparent;
}

.ortlab-Badge-running {
  background: var(--jp-brand-color1);
}

.ortlab-Badge-pending {
  background: var(--jp-brand-color3);
  color: var(--jp-ui-font-color1);
}

.ortlab-Badge-completed {
  background: var(--jp-success-color1);
}

.ortlab-Badge-failed {
  background: var(--jp-error-color1);
}

.ortlab-Badge-stopped {
  background: var(--jp-warn-color1);
}

/* runs */

.ortlab-RunList {
  list-style: none;
  margin: 0;
  padding: 0;
  display: flex;
  flex-direction: column;
  gap: 6px;
}

.ortlab-Run {
  border: var(--jp-border-width) solid var(--jp-border-color2);
  border-radius: var(--jp-border-radius);
  background: var(--jp-layout-color1);
  padding: 6px;
  display: flex;
  flex-direction: column;
  gap: 4px;
  min-width: 0;
}

.ortlab-Run[data-state='running'] {
  border-left: 3px solid var(--jp-brand-color1);
}

.ortlab-Run-head {
  display: flex;
  align-items: center;
  gap: 6px;
  min-width: 0;
}

.ortlab-Run-name {
  font-weight: 600;
  overflow: hidden;
  text-overflow: ellipsis;
  white-space: nowrap;
  min-width: 0;
}

.ortlab-Run-stats {
  display: flex;
  flex-wrap: wrap;
  gap: 2px 10px;
  color: var(--jp-ui-font-color2);
  font-variant-numeric: tabular-nums;
}

.ortlab-Run-step {
  color: var(--jp-ui-font-color1);
}

.ortlab-Run-mix {
  display: flex;
  flex-wrap: wrap;
  gap: 3px;
  align-items: center;
}

.ortlab-Run-notApplied {
  color: var(--jp-warn-color1);
  font-size: var(--jp-ui-font-size0);
  overflow-wrap: anywhere;
}

.ortlab-Run-error {
  color: var(--jp-error-color1);
  font-size: var(--jp-ui-font-size0);
  overflow-wrap: anywhere;
  display: -webkit-box;
  -webkit-line-clamp: 3;
  -webkit-box-orient: vertical;
  overflow: hidden;
}

.ortlab-Run-charts {
  display: flex;
  flex-direction: column;
  gap: 2px;
}

.ortlab-Sparkline {
  display: grid;
  grid-template-columns: 62px minmax(40px, 1fr) 52px;
  align-items: center;
  gap: 6px;
  font-size: var(--jp-ui-font-size0);
  color: var(--jp-ui-font-color2);
  font-variant-numeric: tabular-nums;
}

.ortlab-Sparkline-value {
  text-align: right;
  color: var(--jp-ui-font-color1);
}

.ortlab-Sparkline-svg {
  width: 100%;
  height: 22px;
  background: var(--jp-layout-color2);
  border-radius: var(--jp-border-radius);
}

.ortlab-Sparkline-svg polyline {
  stroke: var(--jp-brand-color1);
  stroke-width: 1.5px;
}

.ortlab-Sparkline-speed .ortlab-Sparkline-svg polyline {
  stroke: var(--jp-accent-color1);
}

.ortlab-Sparkline-svg circle {
  fill: var(--jp-brand-color1);
}

.ortlab-Run-actions {
  display: flex;
  flex-wrap: wrap;
  gap: 4px;
}

.ortlab-Run-actions .jp-Button {
  display: inline-flex;
  align-items: center;
  gap: 3px;
}

.ortlab-ButtonIcon svg {
  width: 14px;
  height: 14px;
  display: block;
}

/* new run form */

.ortlab-NewRun {
  display: flex;
  flex-direction: column;
  gap: 6px;
  padding: 8px;
  border: var(--jp-border-width) solid var(--jp-border-color1);
  border-radius: var(--jp-border-radius);
  background: var(--jp-layout-color2);
}

.ortlab-NewRun-title {
  font-weight: 600;
}

.ortlab-Field {
  display: flex;
  flex-direction: column;
  gap: 2px;
  min-width: 0;
  flex: 1 1 0;
}

.ortlab-Field > span {
  color: var(--jp-ui-font-color2);
  font-size: var(--jp-ui-font-size0);
}

.ortlab-Field input.jp-mod-styled,
.ortlab-Field select.jp-mod-styled {
  height: 26px;
  padding: 0 6px;
  font-size: var(--jp-ui-font-size1);
  width: 100%;
  box-sizing: border-box;
  min-width: 0;
}

.ortlab-Field-row {
  display: flex;
  gap: 6px;
}

.ortlab-Mix,
.ortlab-TaskFields {
  border: var(--jp-border-width) solid var(--jp-border-color2);
  border-radius: var(--jp-border-radius);
  margin: 0;
  padding: 4px 6px;
  display: flex;
  flex-direction: column;
  gap: 2px;
}

.ortlab-Mix legend,
.ortlab-TaskFields legend {
  color: var(--jp-ui-font-color2);
  font-size: var(--jp-ui-font-size0);
  padding: 0 2px;
}

.ortlab-Toggle {
  display: flex;
  flex-wrap: wrap;
  align-items: center;
  gap: 2px 6px;
}

.ortlab-Toggle > span:first-of-type {
  flex: 1 1 0;
  min-width: 0;
}

.ortlab-Toggle input {
  margin: 0;
  accent-color: var(--jp-brand-color1);
}

.ortlab-Toggle-unavailable > span:first-of-type {
  color: var(--jp-ui-font-color3);
}

.ortlab-Toggle-reason {
  flex-basis: 100%;
  padding-left: 19px;
  color: var(--jp-ui-font-color3);
  font-size: var(--jp-ui-font-size0);
  overflow-wrap: anywhere;
}

.ortlab-Problems {
  margin: 0;
  padding-left: 16px;
  color: var(--jp-error-color1);
  overflow-wrap: anywhere;
}

.ortlab-NewRun-actions {
  display: flex;
  justify-content: flex-end;
  gap: 6px;
}

/* the estimate beside Start (estimate.tsx) */

.ortlab-Estimate {
  font-size: var(--jp-ui-font-size0);
  color: var(--jp-ui-font-color2);
  overflow-wrap: anywhere;
}

.ortlab-Estimate[data-pending='true'] {
  opacity: 0.6;
}

.ortlab-Estimate-verdict {
  font-weight: bold;
}

.ortlab-Estimate-nofit .ortlab-Estimate-verdict,
.ortlab-Estimate-nofit .ortlab-Estimate-line {
  color: var(--jp-error-color1);
}

.ortlab-Estimate-refusal {
  white-space: pre-wrap;
  margin-top: 4px;
  padding: 4px 6px;
  border-left: 3px solid var(--jp-error-color1);
  background: var(--jp-layout-color2);
}

.ortlab-Estimate-why {
  white-space: nowrap;
  overflow: hidden;
  text-overflow: ellipsis;
}
`,""]),e.d(o,{},{A:i})},314(r){r.exports=function(r){var o=[];return o.toString=function(){return this.map(function(o){var e="",a=void 0!==o[5];return o[4]&&(e+="@supports (".concat(o[4],") {")),o[2]&&(e+="@media ".concat(o[2]," {")),a&&(e+="@layer".concat(o[5].length>0?" ".concat(o[5]):""," {")),e+=r(o),a&&(e+="}"),o[2]&&(e+="}"),o[4]&&(e+="}"),e}).join("")},o.i=function(r,e,a,t,l){"string"==typeof r&&(r=[[null,r,void 0]]);var i={};if(a)for(var n=0;n<this.length;n++){var p=this[n][0];null!=p&&(i[p]=!0)}for(var s=0;s<r.length;s++){var c=[].concat(r[s]);a&&i[c[0]]||(void 0!==l&&(void 0===c[5]||(c[1]="@layer".concat(c[5].length>0?" ".concat(c[5]):""," {").concat(c[1],"}")),c[5]=l),e&&(c[2]&&(c[1]="@media ".concat(c[2]," {").concat(c[1],"}")),c[2]=e),t&&(c[4]?(c[1]="@supports (".concat(c[4],") {").concat(c[1],"}"),c[4]=t):c[4]="".concat(t)),o.push(c))}},o}},601(r){r.exports=function(r){return r[1]}},72(r){var o=[];function e(r){for(var e=-1,a=0;a<o.length;a++)if(o[a].identifier===r){e=a;break}return e}function a(r,a){for(var t={},l=[],i=0;i<r.length;i++){var n=r[i],p=a.base?n[0]+a.base:n[0],s=t[p]||0,c="".concat(p," ").concat(s);t[p]=s+1;var d=e(c),u={css:n[1],media:n[2],sourceMap:n[3],supports:n[4],layer:n[5]};if(-1!==d)o[d].references++,o[d].updater(u);else{var f=function(r,o){var e=o.domAPI(o);return e.update(r),function(o){o?(o.css!==r.css||o.media!==r.media||o.sourceMap!==r.sourceMap||o.supports!==r.supports||o.layer!==r.layer)&&e.update(r=o):e.remove()}}(u,a);a.byIndex=i,o.splice(i,0,{identifier:c,updater:f,references:1})}l.push(c)}return l}r.exports=function(r,t){var l=a(r=r||[],t=t||{});return function(r){r=r||[];for(var i=0;i<l.length;i++){var n=e(l[i]);o[n].references--}for(var p=a(r,t),s=0;s<l.length;s++){var c=e(l[s]);0===o[c].references&&(o[c].updater(),o.splice(c,1))}l=p}}},659(r){var o={};r.exports=function(r,e){var a=function(r){if(void 0===o[r]){var e=document.querySelector(r);if(window.HTMLIFrameElement&&e instanceof window.HTMLIFrameElement)try{e=e.contentDocument.head}catch(r){e=null}o[r]=e}return o[r]}(r);if(!a)throw Error("Couldn't find a style target. This probably means that the value for the 'insert' parameter is invalid.");a.appendChild(e)}},540(r){r.exports=function(r){var o=document.createElement("style");return r.setAttributes(o,r.attributes),r.insert(o,r.options),o}},56(r,o,e){r.exports=function(r){var o=e.nc;o&&r.setAttribute("nonce",o)}},825(r){r.exports=function(r){if("u"<typeof document)return{update:function(){},remove:function(){}};var o=r.insertStyleElement(r);return{update:function(e){var a,t,l;a="",e.supports&&(a+="@supports (".concat(e.supports,") {")),e.media&&(a+="@media ".concat(e.media," {")),(t=void 0!==e.layer)&&(a+="@layer".concat(e.layer.length>0?" ".concat(e.layer):""," {")),a+=e.css,t&&(a+="}"),e.media&&(a+="}"),e.supports&&(a+="}"),(l=e.sourceMap)&&"u">typeof btoa&&(a+="\n/*# sourceMappingURL=data:application/json;base64,".concat(btoa(unescape(encodeURIComponent(JSON.stringify(l))))," */")),r.styleTagTransform(a,o,r.options)},remove:function(){var r;null===(r=o).parentNode||r.parentNode.removeChild(r)}}}},113(r){r.exports=function(r,o){if(o.styleSheet)o.styleSheet.cssText=r;else{for(;o.firstChild;)o.removeChild(o.firstChild);o.appendChild(document.createTextNode(r))}}},579(r,o,e){var a=e(72),t=e.n(a),l=e(825),i=e.n(l),n=e(659),p=e.n(n),s=e(56),c=e.n(s),d=e(540),u=e.n(d),f=e(113),b=e.n(f),v=e(475),g={};g.styleTagTransform=b(),g.setAttributes=c(),g.insert=p().bind(null,"head"),g.domAPI=i(),g.insertStyleElement=u(),t()(v.A,g),v.A&&v.A.locals&&v.A.locals}}]);