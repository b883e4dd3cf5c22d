"""The `web` env: WebArena-Lite-style tasks through a real headless browser."""

from __future__ import annotations

import random
import re
import threading
import weakref

from esopt.confutil import ConfigError
from esopt.envs.base import Env, Task, check_split
from esopt.envs.web.actions import ACTION_REGEX
from esopt.envs.web.browser import Browser
from esopt.envs.web.config import WebConfig
from esopt.envs.web.episode import WebEpisode, origin
from esopt.envs.web.oracle import Oracle
from esopt.envs.web.site.server import SiteServer
from esopt.envs.web.tasks import builtin_tasks, load_task_file

_PLACEHOLDER = re.compile(r"__([A-Z][A-Z0-9_]*)__")
# Where WebArena's site placeholders point on the built-in site.
BUILTIN_PLACEHOLDERS = {"SITE": "", "SHOPPING": "/shop", "SHOPPING_ADMIN": "/admin", "REDDIT": "/forum"}


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
    config: WebConfig

    def __init__(self, config: WebConfig | None = None):
        super().__init__(config)
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
        return {origin(u) for u in urls if u}
