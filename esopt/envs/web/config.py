"""The web env's settings: the built-in site or an external one, built-in or file tasks, browser and
observation limits."""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

from esopt.confutil import Config, ConfigError, opt
from esopt.envs.web.tasks import TEMPLATES, template_category


@dataclass
class WebConfig(Config):
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

    def check(self) -> None:
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
