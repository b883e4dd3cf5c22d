"""`web`: WebArena-Lite-style web tasks through a real headless browser (Playwright + Chromium).

The built-in site (a shop with search, cart, checkout and order history; a forum with threads,
replies and new threads; an admin area for prices, stock and order status) runs on 127.0.0.1 in a
background thread. Every episode gets its own browser context and its own copy of the site's state
(generated from the task's site seed), so many episodes can be live at once and each starts from
the same state. The agent sees the page as compact text with numbered elements and acts with
WebArena's actions (see `actions.py`); the episode is scored once, after `stop [answer]` or the last
turn, by the task's evaluator: string match of the answer (exact_match, must_include), the final URL
(url_match), or a program check of the site state (program; program_html on external sites).

Example observation::

    OBJECTIVE: Buy 3 Orange Backpack.
    LAST ACTION: Clicked [21].
    PAGE: Orange Backpack | Shop (/shop/product/9)
    [1] link "Home" [2] link "Shop" [3] link "Cart (0)" [4] link "My orders" [5] link "Forum" [6] link "Admin"
    # Orange Backpack
    Price: $16.50
    In stock: 26
    Category: [7] link "Outdoor"
    [8] textbox "Quantity" value="1" [9] button "Add to cart"
    Turn 2 of 12. Reply with one action.

Long pages are shown `max_obs_chars` at a time; `scroll [down]` / `scroll [up]` move the window.
Each episode runs in one thread (Playwright's sync API is thread-bound); many episodes may be live
at once and stepped round-robin. Episodes close their browser context when they end; `env.close()`
(also run at exit) closes the rest, the browser and the site's server.

Real WebArena(-Lite) sites: host them yourself, set `site_url` (and `site_urls` for several sites)
and `task_file` (WebArena-format JSON configs). string_match and url_match work as in WebArena;
program_html checks run in the episode's browser through the page DOM with the task's locator and
required_contents (WebArena's Python "func:" helpers are not available). Resetting such sites
between episodes is up to you, as in WebArena.

Read `env.py` first (the env), then `episode.py` (one task in a browser context: actions,
observations, scoring). Settings: `config.py`; tasks: `tasks.py`; evaluators: `evaluators.py`; the
page as text: `browser.py`; the built-in site: `site/`. A scripted reference solver for the built-in
tasks: `oracle.py`.
"""

from esopt.envs.web.actions import ACTION_REGEX, Action, parse_action
from esopt.envs.web.config import WebConfig
from esopt.envs.web.env import WebEnv
from esopt.envs.web.episode import WebEpisode
from esopt.envs.web.tasks import TEMPLATES, oracle_plan

__all__ = ["ACTION_REGEX", "Action", "parse_action", "WebConfig", "WebEnv", "WebEpisode", "TEMPLATES", "oracle_plan"]
