"""The built-in site's data: a shop, a forum and an admin area as plain Python objects (`SiteState`),
generated from an integer seed (`generate_site`). Each episode gets its own copy, so episodes never see
each other's carts, orders or posts."""

from __future__ import annotations

import copy
import random
import threading
from dataclasses import dataclass, field

COLORS = ["Red", "Blue", "Green", "Black", "White", "Yellow", "Gray", "Orange", "Purple", "Pink"]
NOUNS = {
    "Kitchen": ["Mug", "Kettle", "Plate", "Bowl", "Teapot"],
    "Office": ["Notebook", "Pen", "Lamp", "Stapler", "Folder"],
    "Outdoor": ["Tent", "Backpack", "Bottle", "Cap", "Lantern"],
}
CATEGORIES = list(NOUNS)
USERS = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "mallory", "oscar"]
ORDER_STATUSES = ["pending", "shipped", "delivered", "cancelled"]
THREAD_OPENERS = ["Best", "Cheap", "Broken", "Favorite", "Tips for my", "Review of the", "Help with my", "Selling a"]
REPLY_WORDS = ["great", "useful", "solid", "cheap", "sturdy", "nice", "handy", "light"]
PRODUCTS_PER_CATEGORY = 4


@dataclass
class Product:
    id: int
    name: str
    category: str
    price: float
    stock: int


@dataclass
class OrderItem:
    product_id: int
    name: str
    qty: int
    unit_price: float


@dataclass
class Order:
    id: int
    customer: str
    items: list[OrderItem]
    status: str
    date: str

    @property
    def total(self) -> float:
        return round(sum(i.qty * i.unit_price for i in self.items), 2)


@dataclass
class Post:
    id: int
    author: str
    body: str


@dataclass
class Thread:
    id: int
    title: str
    author: str
    posts: list[Post]  # posts[0] is the opening post; the rest are replies

    @property
    def replies(self) -> list[Post]:
        return self.posts[1:]


@dataclass
class SiteState:
    """The whole mutable state of one site instance (one per episode)."""

    seed: int
    user: str
    users: list[str]
    products: dict[int, Product]
    orders: dict[int, Order]
    threads: dict[int, Thread]
    cart: dict[int, int] = field(default_factory=dict)
    next_order_id: int = 0
    next_thread_id: int = 0
    next_post_id: int = 0
    first_new_order_id: int = 0
    first_new_thread_id: int = 0
    first_new_post_id: int = 0
    flash: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def __deepcopy__(self, memo):
        clone = SiteState.__new__(SiteState)
        for name, value in self.__dict__.items():
            setattr(clone, name, threading.Lock() if name == "lock" else copy.deepcopy(value, memo))
        return clone

    # -- lookups used by task templates and program checks ---------------------------------

    def product_by_name(self, name: str) -> Product | None:
        for p in self.products.values():
            if p.name.lower() == name.lower():
                return p
        return None

    def thread_by_title(self, title: str) -> Thread | None:
        for t in self.threads.values():
            if t.title.lower() == title.lower():
                return t
        return None

    def new_orders(self) -> list[Order]:
        return [o for o in self.orders.values() if o.id >= self.first_new_order_id]

    def new_posts(self) -> list[tuple[Thread, Post]]:
        return [(t, p) for t in self.threads.values() for p in t.posts if p.id >= self.first_new_post_id]

    def new_threads(self) -> list[Thread]:
        return [t for t in self.threads.values() if t.id >= self.first_new_thread_id]


def _price(rng: random.Random) -> float:
    return round(rng.randint(3, 89) + rng.choice([0.0, 0.5, 0.99]), 2)


def generate_site(seed: int) -> SiteState:
    """The initial state of the site for `seed` (deterministic; cheap, pure Python)."""
    rng = random.Random(f"esopt-web-site|{seed}")
    users = rng.sample(USERS, 6)
    user = users[0]
    products: dict[int, Product] = {}
    names: set[str] = set()
    pid = 1
    for cat in CATEGORIES:
        nouns = rng.sample(NOUNS[cat], PRODUCTS_PER_CATEGORY)
        for noun in nouns:
            color = rng.choice([c for c in COLORS if f"{c} {noun}" not in names])
            name = f"{color} {noun}"
            names.add(name)
            products[pid] = Product(pid, name, cat, _price(rng), rng.randint(1, 30))
            pid += 1
    # a few products are sold out (the "out of stock" task needs at least one)
    for p in rng.sample(list(products.values()), rng.randint(1, 3)):
        p.stock = 0
    orders: dict[int, Order] = {}
    oid = 1001
    customers = [user, user] + [rng.choice(users[1:]) for _ in range(rng.randint(2, 4))]
    rng.shuffle(customers)
    for cust in customers:
        items = []
        for p in rng.sample(list(products.values()), rng.randint(1, 2)):
            items.append(OrderItem(p.id, p.name, rng.randint(1, 3), p.price))
        date = f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        orders[oid] = Order(oid, cust, items, rng.choice(ORDER_STATUSES), date)
        oid += 1
    threads: dict[int, Thread] = {}
    titles: set[str] = set()
    post_id = 1
    nouns = [n for ns in NOUNS.values() for n in ns]
    for tid in range(1, rng.randint(4, 6) + 1):
        while True:
            title = f"{rng.choice(THREAD_OPENERS)} {rng.choice(nouns).lower()}"
            title += "?" if title.startswith(("Best", "Cheap", "Help")) else ""
            if title not in titles:
                titles.add(title)
                break
        author = rng.choice(users)
        posts = [Post(post_id, author, f"Anyone have thoughts on this {title.rstrip('?').split()[-1]}?")]
        post_id += 1
        repliers = [u for u in users if u != author]
        for r in range(rng.randint(0, 3)):
            who = repliers[(r + rng.randint(0, len(repliers) - 1)) % len(repliers)]
            posts.append(Post(post_id, who, f"Mine is {rng.choice(REPLY_WORDS)}, {rng.randint(2, 9)} stars."))
            post_id += 1
        threads[tid] = Thread(tid, title, author, posts)
    state = SiteState(
        seed=seed, user=user, users=users, products=products, orders=orders, threads=threads,
        next_order_id=oid, next_thread_id=len(threads) + 1, next_post_id=post_id,
    )
    state.first_new_order_id = state.next_order_id
    state.first_new_thread_id = state.next_thread_id
    state.first_new_post_id = state.next_post_id
    return state
