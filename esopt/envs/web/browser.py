"""Headless Chromium through Playwright's sync API, and the compact text view of a page.

Playwright allows one sync driver per thread, so the driver is shared (reference-counted) by every
`Browser` created in a thread; each `Browser` launches its own Chromium process. Playwright objects
are bound to the thread that created them: use an env (and its episodes) from one thread.

`snapshot(page)` numbers every visible interactive element (links, buttons, text fields, selects,
checkboxes) in document order, stores the number in a `data-esid` attribute (so actions can find
the element again), and renders the page as short lines, e.g.::

    [1] link "Home" [2] link "Shop" [3] link "Cart (0)"
    # Blue Mug
    Price: $12.50
    [7] textbox "Quantity" value="1" [8] button "Add to cart"

Table cells are joined with " | ". The whole page is read (every element gets its number, whether
on screen or not); the env shows a window of these lines that `scroll` moves, so a long page is
read a screenful at a time.
"""

from __future__ import annotations

import os
import shutil
import threading

CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
ID_ATTR = "data-esid"

_drivers: dict[int, list] = {}  # thread id -> [playwright, refcount]
_drivers_lock = threading.Lock()


def playwright_available() -> bool:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return False
    return True


def find_chromium(path: str | None) -> str | None:
    """The Chromium executable to launch: `path` if given, else /usr/bin/chromium or one on PATH;
    None = let Playwright use its own downloaded browser."""
    if path:
        return path
    for candidate in ("/usr/bin/chromium", "/usr/bin/chromium-browser"):
        if os.path.exists(candidate):
            return candidate
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _acquire_driver():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as e:  # pragma: no cover - depends on the install
        raise RuntimeError("the web env needs the `playwright` package (pip install playwright)") from e
    tid = threading.get_ident()
    with _drivers_lock:
        entry = _drivers.get(tid)
        if entry is None:
            entry = _drivers[tid] = [sync_playwright().start(), 0]
        entry[1] += 1
        return entry[0]


def _release_driver(tid: int) -> None:
    with _drivers_lock:
        entry = _drivers.get(tid)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] <= 0:
            del _drivers[tid]
            if tid == threading.get_ident():
                try:
                    entry[0].stop()
                except Exception:
                    pass


class Browser:
    """One Chromium process, started on first use."""

    def __init__(self, executable_path: str | None = None, headless: bool = True):
        self.executable_path = executable_path
        self.headless = headless
        self._browser = None
        self._tid: int | None = None

    @property
    def started(self) -> bool:
        return self._browser is not None

    def get(self):
        if self._browser is None:
            pw = _acquire_driver()
            self._tid = threading.get_ident()
            args = list(CHROMIUM_ARGS)
            if not self.headless:
                args.remove("--headless")
            try:
                self._browser = pw.chromium.launch(
                    executable_path=find_chromium(self.executable_path), headless=self.headless, args=args
                )
            except Exception:
                _release_driver(self._tid)
                self._tid = None
                raise
        return self._browser

    def close(self) -> None:
        if self._browser is not None:
            try:
                self._browser.close()
            except Exception:
                pass
            self._browser = None
        if self._tid is not None:
            _release_driver(self._tid)
            self._tid = None


# The DOM walker. Returns {lines: [...], scrollY, more_below}. It runs in the page, so it is
# JavaScript; it assigns fresh ids on every call (stable while the page does not change).
_SNAPSHOT_JS = r"""
([idAttr, token]) => {
  const fresh = window.__esoptDoc === undefined;
  if (fresh) window.__esoptDoc = token;
  document.querySelectorAll('[' + idAttr + ']').forEach(e => e.removeAttribute(idAttr));
  const BLOCK = new Set(['ADDRESS','ARTICLE','ASIDE','BLOCKQUOTE','BR','DD','DETAILS','DIALOG','DIV','DL','DT',
    'FIELDSET','FIGCAPTION','FIGURE','FOOTER','FORM','H1','H2','H3','H4','H5','H6','HEADER','HR','LI','MAIN',
    'NAV','OL','P','PRE','SECTION','SUMMARY','TABLE','TBODY','THEAD','TFOOT','TR','UL','CAPTION']);
  const SKIP = new Set(['SCRIPT','STYLE','NOSCRIPT','TEMPLATE','HEAD','SVG','CANVAS','IFRAME']);
  const TEXT_INPUTS = new Set(['text','search','email','number','password','tel','url','date','time',
    'datetime-local','month','week','']);
  const lines = []; let cur = []; let nextId = 1;
  const clean = s => (s || '').replace(/\s+/g, ' ').trim();
  const cut = (s, n) => s.length > n ? s.slice(0, n - 1) + '…' : s;
  const q = s => '"' + cut(clean(s), 80).replace(/"/g, "'") + '"';
  const flush = () => { if (cur.length) { lines.push(cur.join(' ')); cur = []; } };
  const labelOf = el => {
    let t = el.getAttribute('aria-label');
    if (!t && el.labels && el.labels.length) {
      const lab = el.labels[0].cloneNode(true);
      lab.querySelectorAll('input,select,textarea,button').forEach(x => x.remove());
      t = lab.textContent;
    }
    return clean(t || el.getAttribute('placeholder') || el.getAttribute('title') || el.getAttribute('name') || '');
  };
  const interactive = el => {
    const tag = el.tagName;
    if (tag === 'A') return el.hasAttribute('href');
    if (tag === 'BUTTON' || tag === 'SELECT' || tag === 'TEXTAREA') return true;
    if (tag === 'INPUT') return el.type !== 'hidden';
    const role = el.getAttribute('role');
    return ['button','link','checkbox','radio','tab','menuitem','option','switch','textbox','combobox'].includes(role);
  };
  const describe = el => {
    const tag = el.tagName, role = el.getAttribute('role');
    let s;
    if (tag === 'A' || role === 'link') s = 'link ' + q(el.innerText || el.getAttribute('aria-label') || el.title);
    else if (tag === 'BUTTON' || role === 'button' || (tag === 'INPUT' && ['submit','button','reset','image'].includes(el.type)))
      s = 'button ' + q(el.innerText || el.value || el.getAttribute('aria-label') || el.title);
    else if (tag === 'INPUT' && (el.type === 'checkbox' || el.type === 'radio'))
      s = el.type + ' ' + q(labelOf(el)) + (el.checked ? ' checked' : '');
    else if (tag === 'SELECT') {
      const opts = [...el.options].map(o => clean(o.text));
      const sel = el.selectedIndex >= 0 ? clean(el.options[el.selectedIndex].text) : '';
      s = 'combobox ' + q(labelOf(el)) + ' selected=' + q(sel) + ' options: ' +
          opts.slice(0, 12).join(' | ') + (opts.length > 12 ? ' | …' : '');
    } else if (tag === 'TEXTAREA' || tag === 'INPUT') {
      s = 'textbox ' + q(labelOf(el)) + (el.value ? ' value=' + q(el.value) : '');
    } else s = (role || tag.toLowerCase()) + ' ' + q(el.innerText || el.getAttribute('aria-label'));
    if (el.disabled) s += ' disabled';
    return s;
  };
  const walk = node => {
    if (node.nodeType === 3) {
      const t = clean(node.textContent);
      if (!t) return;
      const p = node.parentElement;
      if (p && p.closest('label') && p.closest('label').control) return;  // shown as the field's name
      cur.push(cut(t, 300));
      return;
    }
    if (node.nodeType !== 1) return;
    const el = node, tag = el.tagName;
    if (SKIP.has(tag)) return;
    const st = getComputedStyle(el);
    if (st.display === 'none' || el.hidden || el.getAttribute('aria-hidden') === 'true') return;
    const block = BLOCK.has(tag) || st.display === 'block' || st.display === 'flex' || st.display === 'grid';
    if (block) flush();
    if (interactive(el)) {
      const rect = el.getBoundingClientRect();
      if (st.visibility !== 'hidden' && rect.width > 0 && rect.height > 0) {
        const id = nextId++;
        el.setAttribute(idAttr, String(id));
        cur.push('[' + id + '] ' + describe(el));
      }
      if (block) flush();
      return;
    }
    if (/^H[1-6]$/.test(tag)) cur.push('#');
    if ((tag === 'TD' || tag === 'TH') && el.cellIndex > 0 && cur.length) cur.push('|');
    for (const c of el.childNodes) walk(c);
    if (block) flush();
  };
  if (document.body) walk(document.body);
  flush();
  return {lines: lines.filter(l => l !== '#' && l !== '|'), fresh: fresh, title: document.title};
}
"""


def read_page(page) -> tuple[str, list[str], bool]:
    """The title and all lines of `page` (see the module docstring), and whether this is a
    document not read before (a navigation happened since the last read)."""
    for _ in range(3):
        try:
            data = page.evaluate(_SNAPSHOT_JS, [ID_ATTR, 1])
            return str(data["title"]), list(data["lines"]), bool(data["fresh"])
        except Exception:  # the page navigated while we read it: wait and read again
            try:
                page.wait_for_load_state("load")
            except Exception:
                pass
    return "", ["(the page could not be read)"], True


def window(lines: list[str], start: int, max_chars: int) -> list[str]:
    """The lines from `start` on that fit in `max_chars` (at least one, cut if it is too long)."""
    out: list[str] = []
    used = 0
    for line in lines[start:]:
        if out and used + len(line) + 1 > max_chars:
            break
        out.append(line if len(line) <= max_chars else line[: max_chars - 1] + "…")
        used += len(line) + 1
    return out


def window_before(lines: list[str], end: int, max_chars: int) -> int:
    """The start of the window that ends just before line `end` (for scrolling up)."""
    used, start = 0, end
    while start > 0 and (start == end or used + len(lines[start - 1]) + 1 <= max_chars):
        start -= 1
        used += len(lines[start]) + 1
    return start
