"""The built-in site's pages: small server-rendered HTML forms (no JavaScript) drawn from a `SiteState`.
Every write is a POST answered by a 303 redirect (post/redirect/get), as on a real site.

Routes (all GET unless noted):
    /                                   home
    /shop?q=&cat=                       product list with search and category filter
    /shop/product/<id>                  product page; POST /shop/cart/add (pid, qty)
    /shop/cart                          cart; POST /shop/cart/remove (pid)
    /shop/checkout                      order summary; POST places the order
    /shop/orders, /shop/orders/<id>     the signed-in user's order history and one order
    /forum, /forum/thread/<id>          thread list, one thread; POST /forum/thread/<id>/reply (body)
    /forum/new                          new-thread form; POST (title, body)
    /admin, /admin/products, /admin/orders
    /admin/product/<id>                 edit form; POST (price, stock)
    /admin/order/<id>                   order detail; POST (status)
"""

from __future__ import annotations

import html
import re

from esopt.envs.web.site.state import CATEGORIES, ORDER_STATUSES, Order, OrderItem, Post, Product, SiteState, Thread

E = html.escape


def money(x: float) -> str:
    return f"${x:.2f}"


class Redirect(Exception):
    def __init__(self, location: str):
        self.location = location


class NotFound(Exception):
    pass


def _page(state: SiteState, title: str, body: str) -> str:
    n = sum(state.cart.values())
    flash = f'<p role="status">{E(state.flash)}</p>' if state.flash else ""
    state.flash = ""
    return (
        "<!doctype html><html><head><meta charset='utf-8'><link rel='icon' href='data:,'>"
        f"<title>{E(title)}</title></head><body>"
        "<nav><a href='/'>Home</a> <a href='/shop'>Shop</a> "
        f"<a href='/shop/cart'>Cart ({n})</a> <a href='/shop/orders'>My orders</a> "
        "<a href='/forum'>Forum</a> <a href='/admin'>Admin</a></nav>"
        f"{flash}<main>{body}</main></body></html>"
    )


def _int(value: str | None) -> int | None:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def _get_product(state: SiteState, pid: str) -> Product:
    p = state.products.get(_int(pid) or -1)
    if p is None:
        raise NotFound
    return p


def render(state: SiteState, method: str, path: str, query: dict, form: dict) -> str:
    """Handle one request against `state`: returns HTML, or raises Redirect / NotFound."""
    parts = [p for p in path.split("/") if p]
    q1 = lambda d, k: (d.get(k) or [""])[0]  # noqa: E731
    with state.lock:
        if method == "POST":
            _post(state, parts, {k: q1(form, k) for k in form})
        if not parts:
            return _page(state, "Home", (
                f"<h1>Welcome, {E(state.user)}</h1><ul><li><a href='/shop'>Shop</a> (products, cart, orders)</li>"
                "<li><a href='/forum'>Forum</a> (threads and replies)</li>"
                "<li><a href='/admin'>Admin</a> (products and orders)</li></ul>"))
        head, rest = parts[0], parts[1:]
        if head == "shop":
            return _shop(state, rest, q1(query, "q"), q1(query, "cat"))
        if head == "forum":
            return _forum(state, rest)
        if head == "admin":
            return _admin(state, rest)
        raise NotFound


def _shop(state: SiteState, rest: list[str], q: str, cat: str) -> str:
    if not rest:
        items = [p for p in state.products.values()
                 if (not q or q.lower() in p.name.lower() or q.lower() in p.category.lower())
                 and (not cat or p.category.lower() == cat.lower())]
        cats = " ".join(f"<a href='/shop?cat={c}'>{c}</a>" for c in CATEGORIES)
        lis = "".join(f"<li><a href='/shop/product/{p.id}'>{E(p.name)}</a> {money(p.price)}</li>" for p in items)
        what = f"Results for '{E(q)}'" if q else (f"Category {E(cat)}" if cat else "All products")
        return _page(state, "Shop", (
            "<h1>Shop</h1><form method='get' action='/shop'>"
            f"<input name='q' aria-label='Search' value='{E(q, quote=True)}'> <button>Search</button></form>"
            f"<p>Categories: <a href='/shop'>All</a> {cats}</p>"
            f"<h2>{what} ({len(items)})</h2><ul>{lis or '<li>No products found.</li>'}</ul>"))
    if rest[0] == "product" and len(rest) == 2:
        p = _get_product(state, rest[1])
        stock = f"In stock: {p.stock}" if p.stock else "Out of stock"
        form = (f"<form method='post' action='/shop/cart/add'><input type='hidden' name='pid' value='{p.id}'>"
                "<label>Quantity <input name='qty' type='number' value='1' min='1'></label> "
                "<button>Add to cart</button></form>") if p.stock else ""
        return _page(state, f"{p.name} | Shop", (
            f"<h1>{E(p.name)}</h1><p>Price: {money(p.price)}</p><p>{stock}</p>"
            f"<p>Category: <a href='/shop?cat={p.category}'>{p.category}</a></p>{form}"))
    if rest == ["cart"]:
        rows = ""
        for pid, qty in state.cart.items():
            p = state.products[pid]
            rows += (f"<tr><td><a href='/shop/product/{p.id}'>{E(p.name)}</a></td><td>{qty}</td>"
                     f"<td>{money(qty * p.price)}</td><td><form method='post' action='/shop/cart/remove'>"
                     f"<input type='hidden' name='pid' value='{p.id}'><button>Remove</button></form></td></tr>")
        if not rows:
            return _page(state, "Cart | Shop", "<h1>Cart</h1><p>Your cart is empty.</p>")
        total = sum(q * state.products[p].price for p, q in state.cart.items())
        return _page(state, "Cart | Shop", (
            "<h1>Cart</h1><table><tr><th>Product</th><th>Qty</th><th>Subtotal</th><th></th></tr>"
            f"{rows}</table><p>Total: {money(total)}</p><p><a href='/shop/checkout'>Checkout</a></p>"))
    if rest == ["checkout"]:
        if not state.cart:
            return _page(state, "Checkout | Shop", "<h1>Checkout</h1><p>Your cart is empty.</p>")
        lines = "".join(f"<li>{q} x {E(state.products[p].name)}</li>" for p, q in state.cart.items())
        total = sum(q * state.products[p].price for p, q in state.cart.items())
        return _page(state, "Checkout | Shop", (
            f"<h1>Checkout</h1><ul>{lines}</ul><p>Total: {money(total)}</p>"
            "<form method='post' action='/shop/checkout'><button>Place order</button></form>"))
    if rest == ["orders"]:
        rows = "".join(
            f"<tr><td><a href='/shop/orders/{o.id}'>#{o.id}</a></td><td>{o.date}</td>"
            f"<td>{money(o.total)}</td><td>{o.status}</td></tr>"
            for o in state.orders.values() if o.customer == state.user)
        return _page(state, "My orders | Shop", (
            "<h1>My orders</h1><table id='orders'><tr><th>Order</th><th>Date</th><th>Total</th><th>Status</th></tr>"
            f"{rows}</table>"))
    if rest[0] == "orders" and len(rest) == 2:
        o = state.orders.get(_int(rest[1]) or -1)
        if o is None or o.customer != state.user:
            raise NotFound
        return _page(state, f"Order #{o.id} | Shop", _order_detail(o))
    raise NotFound


def _order_detail(o: Order) -> str:
    items = "".join(f"<li>{i.qty} x {E(i.name)} ({money(i.unit_price)} each)</li>" for i in o.items)
    return (f"<h1>Order #{o.id}</h1><p>Customer: {E(o.customer)}</p><p>Date: {o.date}</p>"
            f"<p>Status: <span id='status'>{o.status}</span></p><ul id='items'>{items}</ul>"
            f"<p>Total: {money(o.total)}</p>")


def _forum(state: SiteState, rest: list[str]) -> str:
    if not rest:
        lis = "".join(
            f"<li><a href='/forum/thread/{t.id}'>{E(t.title)}</a> by {E(t.author)}, "
            f"{len(t.replies)} {'reply' if len(t.replies) == 1 else 'replies'}</li>"
            for t in state.threads.values())
        return _page(state, "Forum", f"<h1>Forum</h1><p><a href='/forum/new'>New thread</a></p><ul>{lis}</ul>")
    if rest[0] == "thread" and len(rest) == 2:
        t = state.threads.get(_int(rest[1]) or -1)
        if t is None:
            raise NotFound
        posts = "".join(f"<div class='post'><b>{E(p.author)}:</b> {E(p.body)}</div>" for p in t.posts)
        return _page(state, f"{t.title} | Forum", (
            f"<h1>{E(t.title)}</h1><p>Started by {E(t.author)}, {len(t.replies)} "
            f"{'reply' if len(t.replies) == 1 else 'replies'}</p>{posts}"
            f"<form method='post' action='/forum/thread/{t.id}/reply'>"
            "<textarea name='body' aria-label='Reply'></textarea> <button>Post reply</button></form>"))
    if rest == ["new"]:
        return _page(state, "New thread | Forum", (
            "<h1>New thread</h1><form method='post' action='/forum/new'>"
            "<p><input name='title' aria-label='Title'></p><p><textarea name='body' aria-label='Text'></textarea></p>"
            "<button>Create thread</button></form>"))
    raise NotFound


def _admin(state: SiteState, rest: list[str]) -> str:
    if not rest:
        return _page(state, "Admin", (
            "<h1>Admin</h1><ul><li><a href='/admin/products'>Products</a></li>"
            "<li><a href='/admin/orders'>Orders</a></li></ul>"))
    if rest == ["products"]:
        rows = "".join(f"<tr><td><a href='/admin/product/{p.id}'>{E(p.name)}</a></td><td>{money(p.price)}</td>"
                       f"<td>{p.stock}</td></tr>" for p in state.products.values())
        return _page(state, "Products | Admin", (
            "<h1>Products</h1><table><tr><th>Product</th><th>Price</th><th>Stock</th></tr>"
            f"{rows}</table>"))
    if rest[0] == "product" and len(rest) == 2:
        p = _get_product(state, rest[1])
        return _page(state, f"Edit {p.name} | Admin", (
            f"<h1>Edit {E(p.name)}</h1><form method='post' action='/admin/product/{p.id}'>"
            f"<p><label>Price <input name='price' value='{p.price:.2f}'></label></p>"
            f"<p><label>Stock <input name='stock' value='{p.stock}'></label></p><button>Save</button></form>"))
    if rest == ["orders"]:
        rows = "".join(f"<tr><td><a href='/admin/order/{o.id}'>#{o.id}</a></td><td>{E(o.customer)}</td>"
                       f"<td>{money(o.total)}</td><td>{o.status}</td></tr>" for o in state.orders.values())
        return _page(state, "Orders | Admin", (
            "<h1>Orders</h1><table><tr><th>Order</th><th>Customer</th><th>Total</th><th>Status</th></tr>"
            f"{rows}</table>"))
    if rest[0] == "order" and len(rest) == 2:
        o = state.orders.get(_int(rest[1]) or -1)
        if o is None:
            raise NotFound
        opts = "".join(f"<option{' selected' if s == o.status else ''}>{s}</option>" for s in ORDER_STATUSES)
        return _page(state, f"Order #{o.id} | Admin", (
            _order_detail(o) + f"<form method='post' action='/admin/order/{o.id}'>"
            f"<label>Status <select name='status'>{opts}</select></label> <button>Update status</button></form>"))
    raise NotFound


def _post(state: SiteState, parts: list[str], form: dict[str, str]) -> None:
    """Apply a form submission and redirect (post/redirect/get)."""
    path = "/" + "/".join(parts)
    if path == "/shop/cart/add":
        p = _get_product(state, form.get("pid", ""))
        qty = _int(form.get("qty"))
        if qty is None or qty < 1:
            state.flash = "Quantity must be a whole number of at least 1."
            raise Redirect(f"/shop/product/{p.id}")
        if qty + state.cart.get(p.id, 0) > p.stock:
            state.flash = f"Only {p.stock} in stock."
            raise Redirect(f"/shop/product/{p.id}")
        state.cart[p.id] = state.cart.get(p.id, 0) + qty
        state.flash = f"Added {qty} x {p.name} to the cart."
        raise Redirect("/shop/cart")
    if path == "/shop/cart/remove":
        state.cart.pop(_int(form.get("pid")) or -1, None)
        raise Redirect("/shop/cart")
    if path == "/shop/checkout":
        if not state.cart:
            raise Redirect("/shop/cart")
        items = []
        for pid, qty in state.cart.items():
            p = state.products[pid]
            p.stock -= qty
            items.append(OrderItem(p.id, p.name, qty, p.price))
        o = Order(state.next_order_id, state.user, items, "pending", "2025-01-15")
        state.orders[o.id] = o
        state.next_order_id += 1
        state.cart.clear()
        state.flash = f"Order #{o.id} placed."
        raise Redirect(f"/shop/orders/{o.id}")
    m = re.fullmatch(r"/forum/thread/(\d+)/reply", path)
    if m:
        t = state.threads.get(int(m.group(1)))
        if t is None:
            raise NotFound
        body = form.get("body", "").strip()
        if not body:
            state.flash = "The reply is empty."
        else:
            t.posts.append(Post(state.next_post_id, state.user, body))
            state.next_post_id += 1
            state.flash = "Reply posted."
        raise Redirect(f"/forum/thread/{t.id}")
    if path == "/forum/new":
        title, body = form.get("title", "").strip(), form.get("body", "").strip()
        if not title or not body:
            state.flash = "A thread needs a title and a text."
            raise Redirect("/forum/new")
        t = Thread(state.next_thread_id, title, state.user, [Post(state.next_post_id, state.user, body)])
        state.threads[t.id] = t
        state.next_thread_id += 1
        state.next_post_id += 1
        state.flash = "Thread created."
        raise Redirect(f"/forum/thread/{t.id}")
    m = re.fullmatch(r"/admin/product/(\d+)", path)
    if m:
        p = _get_product(state, m.group(1))
        try:
            price = round(float(form.get("price", "").strip().lstrip("$")), 2)
            stock = int(form.get("stock", "").strip())
            if price < 0 or stock < 0:
                raise ValueError
        except ValueError:
            state.flash = "Price must be a number and stock a whole number, both >= 0."
            raise Redirect(f"/admin/product/{p.id}") from None
        p.price, p.stock = price, stock
        state.flash = "Saved."
        raise Redirect(f"/admin/product/{p.id}")
    m = re.fullmatch(r"/admin/order/(\d+)", path)
    if m:
        o = state.orders.get(int(m.group(1)))
        if o is None:
            raise NotFound
        if form.get("status") in ORDER_STATUSES:
            o.status = form["status"]
            state.flash = "Status updated."
        raise Redirect(f"/admin/order/{o.id}")
    raise NotFound


def not_found(state: SiteState) -> str:
    return _page(state, "Not found", "<h1>Page not found</h1>")
