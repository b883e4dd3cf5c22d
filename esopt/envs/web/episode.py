"""One web task in its own browser context (and, on the built-in site, its own site state): actions
through Playwright, the observation as page text in a scrolling window, the evaluator at the end."""

from __future__ import annotations

import urllib.parse
from typing import TYPE_CHECKING

from esopt.confutil import ConfigError
from esopt.envs.base import Episode, StepResult, Task
from esopt.envs.web.actions import USAGE, Action, parse_action
from esopt.envs.web.browser import ID_ATTR, read_page, window, window_before
from esopt.envs.web.evaluators import program_check, program_html, string_match, url_match
from esopt.envs.web.site.server import SESSION_COOKIE
from esopt.envs.web.site.state import SiteState, generate_site

if TYPE_CHECKING:
    from esopt.envs.web.env import WebEnv


def origin(url: str) -> str:
    u = urllib.parse.urlsplit(url)
    return f"{u.scheme}://{u.netloc}".lower()


class WebEpisode(Episode):
    """One task in its own browser context (and, on the built-in site, its own site state)."""

    def __init__(self, env: WebEnv, task: Task):
        self.env = env
        self.task = task
        self.config = env.config
        self.turn = 0
        self.done = False
        self.answer: str | None = None
        self.closed = False
        self.state: SiteState | None = None
        self._sid: str | None = None
        self.context = None
        self.page = None
        self.info: dict = {}
        self._lines: list[str] = []  # the page's text lines at the last observation
        self._offset = 0  # first line shown (scroll moves it; a new document resets it)
        self._shown = 0  # lines shown in the last observation
        data = task.data
        if data.get("source") == "builtin" and not env.builtin:
            raise ConfigError("built-in tasks need the built-in site (web.site_url unset)")
        self._origins = env.allowed_origins()
        browser = env._res.browser.get()
        opts: dict = {"viewport": {"width": self.config.viewport_width, "height": self.config.viewport_height}}
        if data.get("storage_state"):
            opts["storage_state"] = data["storage_state"]
        try:
            self.context = browser.new_context(**opts)
            self.context.set_default_timeout(self.config.timeout_ms)
            self.context.route("**/*", self._route)
            if env.builtin:
                self.state = generate_site(int(data.get("site_seed", self.config.site_seed)))
                server = env.server()
                self._sid = server.new_session(self.state)
                self.context.add_cookies([{"name": SESSION_COOKIE, "value": self._sid, "url": server.base_url}])
            self.page = self.context.new_page()
            self._opened: list = []  # tabs the site opened (target=_blank links, window.open)
            self.context.on("page", self._on_page)
            self.page.goto(env.resolve_url(data["start_url"]))
        except Exception:
            self.close()
            raise
        self._observation = self._render("")

    # -- browser plumbing ------------------------------------------------------------------

    def _route(self, route) -> None:
        url = route.request.url
        if url.startswith(("data:", "blob:", "about:")) or origin(url) in self._origins:
            route.continue_()
        else:
            route.abort("blockedbyclient")

    def _on_page(self, page) -> None:
        self._opened.append(page)

    def _settle(self) -> None:
        """Wait for the page to load; if the action opened a new tab, continue in that tab."""
        opened = [p for p in self._opened if p is not self.page and not p.is_closed()]
        self._opened.clear()
        if opened:
            self.page = opened[-1]
        try:
            self.page.wait_for_load_state("load")
        except Exception:
            pass

    def _display_url(self) -> str:
        url = self.page.url
        if self.env.builtin:
            base = self.env.base_url()
            if url.startswith(base):
                return url[len(base):] or "/"
        return url

    def _element(self, element: int):
        loc = self.page.locator(f'[{ID_ATTR}="{element}"]')
        return loc if loc.count() else None

    # -- actions ---------------------------------------------------------------------------

    def _apply(self, action: Action) -> tuple[str, bool]:
        """Run one parsed action; returns (feedback, invalid)."""
        page = self.page
        if action.kind in ("click", "type", "select"):
            loc = self._element(action.element)
            if loc is None:
                return f"Invalid: there is no element [{action.element}] on this page.", True
            # links and forms that would open a new tab open in this one (the agent has one tab)
            tag, kind = loc.evaluate(
                "e => { const a = e.closest('a, area'); if (a) a.removeAttribute('target');"
                " if (e.form) e.form.removeAttribute('target'); return [e.tagName, (e.type || '').toLowerCase()]; }"
            )
            if action.kind == "click":
                loc.click()
                self._settle()
                return f"Clicked [{action.element}].", False
            if action.kind == "type":
                typable = tag == "TEXTAREA" or (tag == "INPUT" and kind not in (
                    "submit", "button", "reset", "image", "checkbox", "radio", "file", "hidden"))
                if not typable:
                    hint = " Use select for a combobox." if tag == "SELECT" else ""
                    return f"Invalid: [{action.element}] is not a text field.{hint}", True
                loc.fill(action.text)
                enter = self.config.type_enter_default if action.enter is None else action.enter
                if enter:
                    loc.press("Enter")
                    self._settle()
                return f"Typed into [{action.element}]" + (" and pressed Enter." if enter else "."), False
            if tag != "SELECT":
                return f"Invalid: [{action.element}] is not a combobox.", True
            options = loc.evaluate("e => [...e.options].map(o => [o.value, o.text.trim()])")
            want = action.text.strip().lower()
            for value, label in options:
                if want in (label.lower(), value.lower()):
                    loc.select_option(value=value)
                    self._settle()
                    return f"Selected {label!r} in [{action.element}].", False
            names = ", ".join(label for _, label in options[:12])
            return f"Invalid: [{action.element}] has no option {action.text!r} (options: {names}).", True
        if action.kind == "scroll":
            if action.text == "down":
                if self._offset + self._shown >= len(self._lines):
                    return "Already at the bottom of the page.", False
                self._offset += max(1, self._shown)
            else:
                if self._offset == 0:
                    return "Already at the top of the page.", False
                self._offset = window_before(self._lines, self._offset, self.config.max_obs_chars)
            return f"Scrolled {action.text}.", False
        if action.kind == "go_back":
            if page.go_back() is None:
                return "There is no previous page.", False
            self._settle()
            return "Went back.", False
        if action.kind == "goto":
            url = self.env.resolve_url(action.text)
            if origin(url) not in self._origins or urllib.parse.urlsplit(url).scheme not in ("http", "https"):
                return f"Invalid: {action.text!r} is not a page of this site.", True
            page.goto(url)
            self._settle()
            return f"Opened {self._display_url()}.", False
        raise AssertionError(action.kind)

    def step(self, action: str) -> StepResult:
        if self.done:
            return StepResult(self._observation, 0.0, True, {"invalid": True, "error": "the episode is already over"})
        self.turn += 1
        parsed = parse_action(action)
        stopped = False
        if isinstance(parsed, str):
            feedback, invalid = f"Invalid action: {parsed}. Use one of: {USAGE}", True
        elif parsed.kind == "stop":
            self.answer = parsed.text
            feedback, invalid, stopped = f"Stopped with answer {parsed.text!r}.", False, True
        else:
            try:
                feedback, invalid = self._apply(parsed)
            except Exception as e:  # Playwright errors (timeouts, detached elements): report, never raise
                msg = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
                feedback, invalid = f"Invalid: the action failed ({msg}).", True
                self._settle()
        info: dict = {"invalid": invalid, "turn": self.turn, "action": "invalid" if isinstance(parsed, str) else parsed.kind}
        if invalid:
            info["error"] = feedback
        reward = -float(self.config.invalid_penalty) if invalid and self.config.invalid_penalty else 0.0
        if stopped or self.turn >= self.env.max_turns:
            self.done = True
            success, detail = self.evaluate()
            reward += 1.0 if success else 0.0
            info.update(
                success=success,
                category=self.task.data.get("category"),
                evaluator=self.task.data.get("evaluator"),
                template=self.task.data.get("template"),
                answer=self.answer,
                url=self._display_url(),
                task_id=self.task.id,
            )
            if detail:
                info["eval_detail"] = detail
            feedback += " Episode over: " + ("success." if success else "the objective was not met.")
        self._observation = self._render(feedback)
        self.info = info
        if self.done:
            self.close()
        return StepResult(self._observation, reward, self.done, info)

    # -- evaluation and observation --------------------------------------------------------

    def evaluate(self) -> tuple[bool, str]:
        """Run the task's evaluator on the current state (the final one once the episode is over)."""
        ev = self.task.data["eval"]
        for kind in ev["eval_types"]:
            try:
                if kind == "string_match":
                    ok, detail = string_match(ev["reference_answers"], self.answer)
                elif kind == "url_match":
                    ref = " |OR| ".join(self.env.resolve_url(u) for u in str(ev["reference_url"]).split(" |OR| "))
                    ok, detail = url_match(ref, self.page.url, ev.get("url_note", "GOLD in PRED"))
                elif kind == "program_html":
                    ok, detail = program_html(self.page, ev["program_html"], self.env.resolve_url)
                elif kind == "program":
                    ok, detail = program_check(self.state, ev["program"])
                else:
                    ok, detail = False, f"unsupported eval_type {kind!r}"
            except Exception as e:  # a broken spec or page scores 0, with the reason in info
                ok, detail = False, f"{kind} failed: {type(e).__name__}: {str(e)[:160]}"
            if not ok:
                return False, detail
        return True, ""

    def _render(self, feedback: str) -> str:
        lines = [f"OBJECTIVE: {self.task.data['intent']}"]
        if feedback:
            lines.append(f"LAST ACTION: {feedback}")
        try:
            title, self._lines, fresh = read_page(self.page)
            if fresh or self._offset >= len(self._lines):
                self._offset = 0
            shown = window(self._lines, self._offset, self.config.max_obs_chars)
            self._shown = len(shown)
            lines.append(f"PAGE: {title} ({self._display_url()})")
            if self._offset > 0:
                lines.append("(more above: scroll [up])")
            lines.extend(shown)
            if self._offset + self._shown < len(self._lines):
                lines.append("(more below: scroll [down])")
        except Exception as e:
            lines.append(f"PAGE: (unreadable: {str(e).splitlines()[0][:120] if str(e) else type(e).__name__})")
        if not self.done:
            lines.append(f"Turn {self.turn + 1} of {self.env.max_turns}. Reply with one action.")
        return "\n".join(lines)

    @property
    def observation(self) -> str:
        return self._observation

    def close(self) -> None:
        """Release the browser context and the site session (the final `state` stays readable)."""
        if self.closed:
            return
        self.closed = True
        if self.context is not None:
            try:
                self.context.close()
            except Exception:
                pass
        if self._sid is not None and self.env._res.server is not None:
            self.env._res.server.drop_session(self._sid)
        self.env._res.episodes.discard(self)
