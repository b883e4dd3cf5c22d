"""The built-in website the web env's tasks run on: a shop, a forum and an admin area. `state.py` holds
the data and generates it from a seed, `pages.py` renders every page and applies every form,
`server.py` serves them over HTTP on 127.0.0.1, one independent state per episode's session."""
