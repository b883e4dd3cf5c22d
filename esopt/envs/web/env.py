"""The `web` env: WebArena-Lite-style tasks through a real headless browser."""

from __future__ import annotations

import random
import re
import threading
import urllib.parse
import weakref
from dataclasses import dataclass

from esopt.confutil import ConfigError, opt
from esopt.envs.base import Env, Episode, StepResult, Task, check_split
from esopt.envs.web.actions import ACTION_REGEX, USAGE, Action, parse_action
from esopt.envs.web.browser import ID_ATTR, Browser, read_page, window, window_before
from esopt.envs.web.oracle import Oracle
from esopt.envs.web.evaluators import program_check, program_html, string_match, url_match
from esopt.envs.web.site import SESSION_COOKIE, SiteServer, SiteState, generate_site
from esopt.envs.web.tasks import TEMPLATES, builtin_tasks, load_task_file, template_category

_PLACEHOLDER = re.compile(r"__([A-Z][A-Z0-9_]*)__")
# Where WebArena's site placeholders point on the built-in site.
BUILTIN_PLACEHOLDERS = {"SITE": "", "SHOPPING": "/shop", "SHOPPING_ADMIN": "/admin", "REDDIT": "/forum"}


@dataclass
class WebConfig:
    site_url: str | None = opt(
        None,
        "Base URL of an externally hosted site, e.g. a WebArena-Lite deployment "
        "('http://host:7770'); None = start the built-in shop/forum/admin site on 127.0.0.1.",
    )
    site_urls: dict = opt(
        {},
        "For task files: WebArena placeholder -> URL, e.g. {SHOPPING: 'http://host:7770', REDDIT: "
        "'http://host:9999'}; a placeholder not listed maps to site_url. Every host here (and "
        "site_url's) is the only traffic the browser is allowed.",
    )
    task_file: str | None = opt(
        None,
        "JSON file of WebArena-format task configs (start_url, intent, eval with eval_types "
        "string_match / url_match / program_html); None = the built-in generated tasks.",
    )
    eval_percent: int = opt(20, "Task files: percent of tasks without a 'split' key that go to eval (by task_id hash).")
    site_seed: int = opt(0, "Built-in site data for task-file tasks that set no 'site_seed' of their own.")
    templates: list = opt([], "Built-in task templates to draw from ([] = all; see esopt.envs.web.tasks.TEMPLATES).")
    categories: list = opt([], "Built-in task categories to draw from: shop, forum, admin ([] = all).")
    max_turns: int = opt(12, "Actions per episode; the evaluator runs after stop or after the last turn.")
    max_obs_chars: int = opt(1500, "Characters of page text per observation (the rest: scroll [down]).")
    viewport_width: int = opt(1280, "Browser viewport width in pixels.")
    viewport_height: int = opt(720, "Browser viewport height in pixels (scroll moves by 80% of it).")
    type_enter_default: bool = opt(
        True, "WebArena semantics: `type [id] [text]` presses Enter afterwards unless a trailing [0] is given; "
        "false = Enter only with a trailing [1].",
    )
    invalid_penalty: float = opt(0.0, "Reward subtracted for each malformed or impossible action.")
    chromium_path: str | None = opt(
        None, "Chromium executable; None = /usr/bin/chromium (or chromium on PATH), else Playwright's own."
    )
    headless: bool = opt(True, "Run the browser headless.")
    timeout_ms: int = opt(5000, "Playwright timeout of one action or page load, in milliseconds.")

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_obs_chars", "viewport_width", "viewport_height", "timeout_ms"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"web.{name} must be a positive integer, got {v!r}")
        if not isinstance(self.eval_percent, int) or not 0 <= self.eval_percent <= 100:
            raise ConfigError(f"web.eval_percent must be an integer in 0..100, got {self.eval_percent!r}")
        for name in ("type_enter_default", "headless"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"web.{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("site_url", "task_file", "chromium_path"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, str) and v):
                raise ConfigError(f"web.{name} must be a non-empty string or null, got {v!r}")
        if self.site_url is not None and urllib.parse.urlsplit(self.site_url).scheme not in ("http", "https"):
            raise ConfigError(f"web.site_url must be an http(s) URL, got {self.site_url!r}")
        if not isinstance(self.site_urls, dict):
            raise ConfigError(f"web.site_urls must be a mapping, got {self.site_urls!r}")
        for k, v in self.site_urls.items():
            if not isinstance(v, str) or urllib.parse.urlsplit(v).scheme not in ("http", "https"):
                raise ConfigError(f"web.site_urls[{k!r}] must be an http(s) URL, got {v!r}")
        unknown = [t for t in self.templates if t not in TEMPLATES]
        if unknown:
            raise ConfigError(f"web.templates: unknown {unknown}; available: {', '.join(TEMPLATES)}")
        bad = [c for c in self.categories if c not in ("shop", "forum", "admin")]
        if bad:
            raise ConfigError(f"web.categories: unknown {bad}; available: shop, forum, admin")
        if not isinstance(self.invalid_penalty, (int, float)) or isinstance(self.invalid_penalty, bool):
            raise ConfigError(f"web.invalid_penalty must be a number, got {self.invalid_penalty!r}")
        if self.site_url is None and self.task_file is None and not self._templates():
            raise ConfigError("web.templates and web.categories select no template")

    def _templates(self) -> list[str]:
        return [
            t for t in (self.templates or list(TEMPLATES))
            if not self.categories or template_category(t) in self.categories
        ]


class _Resources:
    """What an env holds open; closed by `WebEnv.close()`, or at exit / garbage collection."""

    def __init__(self, config: WebConfig):
        self.browser = Browser(config.chromium_path, config.headless)
        self.server: SiteServer | None = None
        self.episodes: weakref.WeakSet = weakref.WeakSet()
        self.lock = threading.Lock()

    def close(self) -> None:
        for ep in list(self.episodes):
            ep.close()
        self.browser.close()
        if self.server is not None:
            self.server.close()
            self.server = None


class WebEnv(Env):
    """Web tasks (shop, forum, admin) solved through headless Chromium; reward 1 if the evaluator passes."""

    name = "web"
    Config = WebConfig

    def __init__(self, config: WebConfig | None = None):
        super().__init__(config)
        self.config: WebConfig
        self._res = _Resources(self.config)
        self._finalizer = weakref.finalize(self, self._res.close)
        self._file_tasks: list[Task] | None = None

    # -- protocol --------------------------------------------------------------------------

    @property
    def max_turns(self) -> int:
        return self.config.max_turns

    @property
    def action_regex(self) -> str:
        return ACTION_REGEX

    @property
    def system_prompt(self) -> str:
        enter = (
            "type [id] [text] fills a field and presses Enter (type [id] [text] [0]: no Enter)"
            if self.config.type_enter_default
            else "type [id] [text] fills a field (type [id] [text] [1]: then press Enter)"
        )
        return (
            "You are a web agent using a browser to complete an objective on a website "
            "(a shop, a forum and an admin area).\n"
            "Each turn you see the current page; its interactive elements have numbers, e.g. "
            '[3] link "Cart", [7] textbox "Search", [8] button "Search".\n'
            "Reply with exactly one action:\n"
            "click [id]\n"
            f"{enter}\n"
            "select [id] [option] chooses an option of a combobox\n"
            "scroll [down] or scroll [up]\n"
            "go_back\n"
            "goto [url] opens a page of this site, e.g. goto [/shop/cart]\n"
            "stop [answer] ends the task; give the answer if the objective asks a question, else stop [done]"
        )

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        check_split(split)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be a non-negative integer, got {n!r}")
        if self.config.task_file is None:
            if self.config.site_url is not None:
                raise ConfigError("web.site_url is set: give web.task_file with tasks for that site")
            return builtin_tasks(split, n, seed, self.config._templates())
        if self._file_tasks is None:
            self._file_tasks = load_task_file(self.config.task_file, self.config.eval_percent)
        pool = [t for t in self._file_tasks if t.data["split"] == split]
        if n and not pool:
            raise ConfigError(f"web.task_file {self.config.task_file!r} has no {split} tasks")
        order = random.Random(f"esopt-web-file|{split}|{seed}").sample(pool, len(pool))
        return [order[i % len(order)] for i in range(n)]  # repeats once the pool is exhausted

    def oracle(self, task: Task):
        """The reference plan of a built-in task, followed by reading the observations (see oracle.py);
        tasks from a task file have none."""
        return Oracle(task) if task.data.get("source") == "builtin" else None

    def start(self, task: Task) -> "WebEpisode":
        ep = WebEpisode(self, task)
        self._res.episodes.add(ep)
        return ep

    def close(self) -> None:
        """Close every live episode, the browser and the built-in site's server."""
        self._finalizer()

    def __enter__(self) -> "WebEnv":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- helpers ---------------------------------------------------------------------------

    @property
    def builtin(self) -> bool:
        return self.config.site_url is None and not self.config.site_urls

    def server(self) -> SiteServer:
        with self._res.lock:
            if self._res.server is None:
                self._res.server = SiteServer()
            return self._res.server

    def base_url(self) -> str:
        return self.server().base_url if self.builtin else (self.config.site_url or "").rstrip("/")

    def resolve_url(self, url: str) -> str:
        """Replace WebArena placeholders (__SHOPPING__, __SITE__, ...) and make site paths absolute."""
        base = self.base_url()

        def sub(m: re.Match) -> str:
            key = m.group(1)
            if self.builtin:
                return base + BUILTIN_PLACEHOLDERS.get(key, "")
            if key in self.config.site_urls:
                return self.config.site_urls[key].rstrip("/")
            if self.config.site_url:
                return self.config.site_url.rstrip("/")
            raise ConfigError(f"no URL for the placeholder __{key}__: set web.site_urls or web.site_url")

        url = _PLACEHOLDER.sub(sub, str(url).strip())
        if url.startswith("/"):
            url = base + url
        return url

    def allowed_origins(self) -> set[str]:
        urls = [self.base_url(), *self.config.site_urls.values()]
        return {_origin(u) for u in urls if u}


def _origin(url: str) -> str:
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
        if url.startswith(("data:", "blob:", "about:")) or _origin(url) in self._origins:
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
            if _origin(url) not in self._origins or urllib.parse.urlsplit(url).scheme not in ("http", "https"):
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
