"""Invented values for the docqa documents: word pools (names, companies, places, items) and `Values`,
which draws a document's names, identifiers, dates and amounts without repeating one within it."""

from __future__ import annotations

import random

# ----------------------------------------------------------------------------------------------
# Word pools (invented; any resemblance to real entities is coincidental)
# ----------------------------------------------------------------------------------------------

FIRST = [
    "Alice", "Bruno", "Chloe", "Dmitri", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kara",
    "Liam", "Maya", "Nikhil", "Olga", "Pedro", "Quinn", "Rosa", "Samir", "Tara", "Umar", "Vera",
    "Wen", "Ximena", "Yusuf", "Zoe", "Amara", "Bjorn", "Carmen", "Derek", "Esther", "Felix",
    "Greta", "Hamid", "Ivy", "Jamal", "Keiko", "Lars", "Mina", "Noah", "Priya", "Rafael", "Sofia",
    "Tomas", "Ulla", "Victor", "Willa", "Yara",
]
LAST = [
    "Abbott", "Baptiste", "Castillo", "Delacroix", "Eriksen", "Fontaine", "Gallagher", "Haddad",
    "Ibsen", "Jablonski", "Kowalski", "Lindqvist", "Moreau", "Nakamura", "Okafor", "Petrov",
    "Quintero", "Rasmussen", "Santoro", "Takahashi", "Ulrich", "Vasquez", "Whitfield", "Xu",
    "Yamamoto", "Zielinski", "Brennan", "Carver", "Dunmore", "Ellison", "Ferreira", "Grimaldi",
    "Holloway", "Iverson", "Jovanovic", "Kimura", "Lombardi", "Mbeki", "Novak", "Ortega",
    "Pemberton", "Rhodes", "Sandoval", "Thornton", "Valente", "Winslow",
]
CO_A = [
    "Blue Harbor", "Northwind", "Silver Oak", "Redstone", "Brightpath", "Cedar Point", "Ironbridge",
    "Lakeside", "Maple Ridge", "Summit", "Granite Peak", "Riverbend", "Sunfield", "Westgate",
    "Copperleaf", "Harborview", "Pinecrest", "Starling", "Tidewater", "Evergreen",
]
CO_B = [
    "Logistics", "Supplies", "Analytics", "Manufacturing", "Consulting", "Foods", "Systems",
    "Textiles", "Energy", "Software", "Instruments", "Freight", "Labs", "Design", "Medical",
]
CO_SUFFIX = ["Ltd", "LLC", "Inc", "GmbH", "Co", "Group", "Partners"]
STREETS = [
    "Elm Street", "Harbor Road", "Kings Avenue", "Mill Lane", "Oak Boulevard", "Station Road",
    "Park Place", "Willow Way", "Quarry Drive", "Beacon Street", "Orchard Lane", "Canal Road",
]
CITIES = [
    "Springfield", "Riverton", "Lakewood", "Fairview", "Greenville", "Bristol", "Ashford",
    "Kingsport", "Milton", "Westbury", "Northam", "Clearwater", "Oakdale", "Brookfield",
]
ITEMS = [
    "Desk Lamp", "Office Chair", "Laptop Stand", "Wireless Mouse", "USB-C Hub", "Printer Paper",
    "Monitor Arm", "Filing Cabinet", "Whiteboard", "Label Printer", "Ink Cartridge", "Keyboard",
    "Webcam", "Headset", "Desk Organizer", "Cable Tray", "Paper Shredder", "Projector",
    "Extension Cord", "Storage Box", "Safety Gloves", "Toner Kit", "Network Switch", "Router",
]
SERVICES = [
    "Installation Service", "Annual Maintenance", "Training Session", "Consulting Hours",
    "Data Migration", "Support Plan", "Site Survey", "Equipment Rental",
]
CARRIERS = ["FastShip", "BlueLine Cargo", "Northstar Express", "Orbit Freight", "Swift Parcel", "TransCo"]
DEPARTMENTS = ["Finance", "Operations", "Sales", "Research", "Logistics", "Customer Support", "Facilities"]
TITLES = ["Operations Manager", "Finance Director", "Project Lead", "Senior Analyst", "Head of Sales",
          "Quality Officer", "Program Coordinator"]
INCIDENTS = ["a rear-end collision", "water damage from a burst pipe", "a kitchen fire", "storm damage to the roof",
             "a break-in and theft", "a fallen tree on the garage"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]
FILLER = [
    "All amounts are stated in the currency shown unless otherwise noted.",
    "Please retain this document for your records.",
    "Questions about this document may be directed to the contact listed above.",
    "This document was generated electronically and is valid without a signature.",
    "Late payments may be subject to a fee as described in the terms.",
    "Goods remain the property of the seller until paid in full.",
    "Any discrepancies must be reported within 14 days of receipt.",
    "Information in this document is confidential and intended for the addressee only.",
    "Figures are rounded to the nearest cent.",
    "The terms printed overleaf form part of this agreement.",
]


class Values:
    """Random values for one document; never repeats a value within the document."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()
        self.date_style = rng.randrange(3)
        self.currency = rng.choice(["$", "$", "EUR ", "GBP "])

    def unique(self, make) -> str:
        for _ in range(1000):
            v = make()
            if v not in self.used:
                self.used.add(v)
                return v
        raise RuntimeError("could not draw a unique value")

    def person(self) -> str:
        r = self.rng
        return self.unique(lambda: f"{r.choice(FIRST)} {r.choice(LAST)}")

    def company(self) -> str:
        r = self.rng
        return self.unique(lambda: f"{r.choice(CO_A)} {r.choice(CO_B)} {r.choice(CO_SUFFIX)}")

    def address(self) -> str:
        r = self.rng
        return f"{r.randint(1, 980)} {r.choice(STREETS)}, {r.choice(CITIES)} {r.randint(10000, 99999)}"

    def ident(self, prefix: str, digits: int = 5, letters: int = 0) -> str:
        r = self.rng

        def make() -> str:
            core = "".join(r.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(letters))
            core += "".join(r.choice("0123456789") for _ in range(digits))
            return f"{prefix}-{core}" if prefix else core

        return self.unique(make)

    def day(self, year: int | None = None) -> tuple[int, int, int]:
        r = self.rng
        return (year or r.randint(2019, 2025), r.randint(1, 12), r.randint(1, 28))

    def fmt_date(self, ymd: tuple[int, int, int]) -> str:
        y, m, d = ymd
        if self.date_style == 0:
            return f"{MONTHS[m - 1]} {d}, {y}"
        if self.date_style == 1:
            return f"{y}-{m:02d}-{d:02d}"
        return f"{d} {MONTHS[m - 1][:3]} {y}"

    def date(self, year: int | None = None) -> str:
        return self.unique(lambda: self.fmt_date(self.day(year)))

    def later(self, ymd: tuple[int, int, int], days: int) -> tuple[int, int, int]:
        y, m, d = ymd
        d += days
        while d > 28:
            d -= 28
            m += 1
            if m > 12:
                m, y = 1, y + 1
        return (y, m, d)

    def money(self, cents: int) -> str:
        return f"{self.currency}{cents / 100:,.2f}"
