// A virtualised table: fixed-height rows, only those in view (plus a margin) are in the DOM, so 5,000 or 50,000
// rows cost the same to scroll. Rows change through update(); a repaint is scheduled once per animation frame,
// and only the visible rows are rebuilt.

import {h} from "./format.js";

const ROW_HEIGHT = 28;
const OVERSCAN = 8;

// columns: [{key, label, render(row) → Node|string, sort(row) → comparable, width}]
export class VirtualTable {
  constructor(columns, {height = 560, rowKey = (r) => r.name, emptyText = "nothing to show"} = {}) {
    this.columns = columns;
    this.rowKey = rowKey;
    this.emptyText = emptyText;
    this.rows = [];
    this.view = [];
    this.filter = () => true;
    this.sortKey = null;
    this.sortDir = 1;
    this.frame = 0;
    this.root = h("div", {class: "vtable", role: "table"});
    this.head = h("div", {class: "vhead", role: "row"});
    this.scroller = h("div", {class: "vscroll", style: `height:${height}px`});
    this.spacer = h("div", {class: "vspacer"});
    this.body = h("div", {class: "vbody"});
    this.spacer.append(this.body);
    this.scroller.append(this.spacer);
    this.root.append(this.head, this.scroller);
    this.template = columns.map((c) => c.width || "1fr").join(" ");
    this.head.style.gridTemplateColumns = this.template;
    for (const column of columns) {
      const cell = h("div", {class: "vcell vth", role: "columnheader", "data-key": column.key}, column.label);
      if (column.sort) cell.addEventListener("click", () => this.sortBy(column.key));
      this.head.append(cell);
    }
    this.scroller.addEventListener("scroll", () => this.schedule(), {passive: true});
  }

  setRows(rows) {
    this.rows = rows;
    this.refilter();
  }

  setFilter(predicate) {
    this.filter = predicate;
    this.refilter();
  }

  sortBy(key) {
    this.sortDir = this.sortKey === key ? -this.sortDir : 1;
    this.sortKey = key;
    for (const cell of this.head.children) {
      cell.classList.toggle("sorted", cell.dataset.key === key);
      cell.dataset.dir = cell.dataset.key === key ? (this.sortDir > 0 ? "asc" : "desc") : "";
    }
    this.refilter();
  }

  // Re-apply filter and sort (after a bulk change); a row's own change only needs update().
  refilter() {
    this.view = this.rows.filter(this.filter);
    if (this.sortKey) {
      const column = this.columns.find((c) => c.key === this.sortKey);
      const dir = this.sortDir;
      const keyed = this.view.map((row) => [column.sort(row), row]);
      keyed.sort((a, b) => {
        const x = a[0], y = b[0];
        if (x === y) return 0;
        if (x === null || x === undefined) return 1;
        if (y === null || y === undefined) return -1;
        return x < y ? -dir : dir;
      });
      this.view = keyed.map((pair) => pair[1]);
    }
    this.schedule();
  }

  // Rows changed in place: repaint on the next frame if any is on screen (cheap either way).
  update() {
    this.schedule();
  }

  schedule() {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      this.paint();
    });
  }

  paint() {
    const total = this.view.length;
    this.spacer.style.height = `${Math.max(total * ROW_HEIGHT, ROW_HEIGHT)}px`;
    const top = this.scroller.scrollTop;
    const height = this.scroller.clientHeight || 560;
    const first = Math.max(0, Math.floor(top / ROW_HEIGHT) - OVERSCAN);
    const last = Math.min(total, Math.ceil((top + height) / ROW_HEIGHT) + OVERSCAN);
    this.body.style.transform = `translateY(${first * ROW_HEIGHT}px)`;
    const fragment = document.createDocumentFragment();
    if (total === 0) fragment.append(h("div", {class: "vempty"}, this.emptyText));
    for (let i = first; i < last; i++) {
      const row = this.view[i];
      const line = h("div", {class: "vrow", role: "row", "data-key": this.rowKey(row)});
      line.style.gridTemplateColumns = this.template;
      for (const column of this.columns) {
        line.append(h("div", {class: "vcell", role: "cell"}, column.render(row)));
      }
      fragment.append(line);
    }
    this.body.replaceChildren(fragment);
    this.root.dataset.rows = String(total);
  }
}
