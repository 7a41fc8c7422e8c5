"""A seeded generator of well-typed DRA device-selector expressions, for cost-estimate checks.

Random expressions from the grammar of the DRA CEL environment (`device.driver`, attributes
and capacity by domain and id, the string / list / regex / quantity / semver / ip / cidr /
url libraries, `cel.bind`, one- and two-variable comprehensions and `sortBy`), with
comprehensions nested 0-4 deep over the device maps and over lists, so that the estimated
costs land far below, near and above upstream's limit of 1,000,000. Every list literal is
homogeneous (upstream rejects mixed-type literals). The corpus is compared with a real
kube-apiserver by tests/integration/test_cel_corpus_apiserver.py.

Hand-written because no library generates CEL for a given environment; it is a test tool.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

DOMAINS = ("gpu.example.com", "numa.example.org", "other.dev")
STRING_IDS = ("model", "uuid", "productName")
INT_IDS = ("index", "node")
VERSION_IDS = ("driverVersion", "cudaComputeCapability")
BOOL_IDS = ("mig",)
CAPACITY_IDS = ("memory", "multiprocessors", "watts")
WORDS = ("H100", "a", "gpu-0", "x,y", "NVIDIA H100 80GB HBM3", "", "10.0.0.1", "abc")
REGEXES = ("^H[0-9]+$", "a", "[a-z]+", "^(gpu|GPU)-[0-9a-f-]+$")
QUANTITIES = ("1", "40Gi", "1k", "500m", "80Gi")
SEMVERS = ("1.2.3", "535.0.0", "9.0.0")

# Types the generator tracks.
BOOL, INT, STRING, QUANTITY, SEMVER, DYN = "bool", "int", "string", "quantity", "semver", "dyn"
LIST_INT, LIST_STRING = "list(int)", "list(string)"
# Map ranges: (expression kind, key type, value type); `key` of a domain map is a domain.
DOMAIN_KEY = "domain"


@dataclass
class _Scope:
    """Bound names by type (comprehension and cel.bind variables)."""

    names: dict[str, list[str]] = field(default_factory=dict)

    def bind(self, name: str, kind: str) -> _Scope:
        copy = {k: list(v) for k, v in self.names.items()}
        copy.setdefault(kind, []).append(name)
        return _Scope(copy)

    def pick(self, rng: random.Random, kind: str) -> str | None:
        found = self.names.get(kind, [])
        return rng.choice(found) if found else None


class Generator:
    def __init__(self, seed: int, *, transform_map: bool = False) -> None:
        self.rng = random.Random(seed)
        self.counter = 0
        # transformMap / transformMapEntry: off by default, and then no random draw is spent on
        # them, so the default corpus stays what the apiserver comparison was run on.
        self.transform_map = transform_map

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    # ------------------------------------------------------------------ entry point

    def expression(self) -> str:
        """One boolean selector with 0-4 nested comprehensions."""
        nesting = self.rng.choice((0, 1, 1, 2, 2, 3, 3, 4))
        return self.nested(nesting, _Scope())

    def nested(self, levels: int, scope: _Scope) -> str:
        if levels == 0:
            return self.boolean(scope, 2)
        rng = self.rng
        choice = rng.random()
        if choice < 0.1:
            name = self.fresh("b")
            kind, value = self.any_value(scope, 1)
            return f"cel.bind({name}, {value}, {self.nested(levels, scope.bind(name, kind))})"
        inner = lambda s: self.nested(levels - 1, s)  # noqa: E731
        result = self.comprehension(scope, inner)
        if rng.random() < 0.3:
            op = rng.choice(("&&", "||"))
            result = f"({result} {op} {self.boolean(scope, 1)})"
        return result

    # ------------------------------------------------------------------ comprehensions

    def comprehension(self, scope: _Scope, body: Callable[[_Scope], str]) -> str:
        rng = self.rng
        kind = rng.random()
        if kind < 0.55:
            rng_expr, key_kind, value_kind = self.map_range(scope)
            if self.transform_map and rng.random() < 0.3:
                return self.transformed_map(rng_expr, key_kind, value_kind, scope, body)
            if rng.random() < 0.3:
                k, v = self.fresh("k"), self.fresh("v")
                inner = scope.bind(k, key_kind).bind(v, value_kind)
                macro = rng.choice(("all", "exists", "existsOne"))
                return f"{rng_expr}.{macro}({k}, {v}, {body(inner)})"
            k = self.fresh("k")
            macro = rng.choice(("all", "exists", "exists_one"))
            return f"{rng_expr}.{macro}({k}, {body(scope.bind(k, key_kind))})"
        list_kind = rng.choice((LIST_INT, LIST_STRING))
        list_expr = self.list_value(list_kind, scope, 1)
        element = INT if list_kind == LIST_INT else STRING
        x = self.fresh("x")
        inner = scope.bind(x, element)
        shape = rng.random()
        if shape < 0.5:
            macro = rng.choice(("all", "exists", "exists_one"))
            return f"{list_expr}.{macro}({x}, {body(inner)})"
        if shape < 0.7:
            return f"{list_expr}.filter({x}, {body(inner)}).size() > 0"
        if shape < 0.8:
            return f"{list_expr}.map({x}, {body(inner)}).exists(r, r)"
        if shape < 0.85:
            i = self.fresh("i")
            return f"{list_expr}.transformList({i}, {x}, {body(inner.bind(i, INT))}).exists(r, r)"
        i = self.fresh("i")
        both = inner.bind(i, INT)
        if self.transform_map and rng.random() < 0.3:
            return self.transformed_map(list_expr, INT, element, scope, body)
        macro = rng.choice(("all", "exists", "existsOne"))
        return f"{list_expr}.{macro}({i}, {x}, {body(both)})"

    def transformed_map(
        self, range_expr: str, key_kind: str, value_kind: str, scope: _Scope, body: Callable[[_Scope], str]
    ) -> str:
        """transformMap / transformMapEntry over a map or list, its bool values then read back."""
        rng = self.rng
        k, v, t, r = self.fresh("k"), self.fresh("v"), self.fresh("t"), self.fresh("r")
        inner = scope.bind(k, key_kind).bind(v, value_kind)
        if rng.random() < 0.5:
            made = f"{range_expr}.transformMap({k}, {v}, {body(inner)})"
        else:
            # The entry's key is the element's key: string keys from maps, int keys from lists.
            made = f"{range_expr}.transformMapEntry({k}, {v}, {{{k}: {body(inner)}}})"
        macro = rng.choice(("all", "exists"))
        return f"cel.bind({t}, {made}, {t}.{macro}({r}, {t}[{r}]))"

    def map_range(self, scope: _Scope) -> tuple[str, str, str]:
        rng = self.rng
        choice = rng.random()
        domain_var = scope.pick(rng, DOMAIN_KEY)
        if choice < 0.2:
            return "device.attributes", DOMAIN_KEY, "map"
        if choice < 0.3:
            return "device.capacity", DOMAIN_KEY, "map"
        if choice < 0.75:
            index = domain_var if domain_var and rng.random() < 0.5 else f'"{rng.choice(DOMAINS)}"'
            return f"device.attributes[{index}]", STRING, DYN
        index = domain_var if domain_var and rng.random() < 0.5 else f'"{rng.choice(DOMAINS)}"'
        return f"device.capacity[{index}]", STRING, QUANTITY

    # ------------------------------------------------------------------ typed values

    def any_value(self, scope: _Scope, depth: int) -> tuple[str, str]:
        kind = self.rng.choice((INT, STRING, QUANTITY, SEMVER, LIST_INT, LIST_STRING))
        if kind in (LIST_INT, LIST_STRING):
            return kind, self.list_value(kind, scope, depth)
        return kind, self.value(kind, scope, depth)

    def value(self, kind: str, scope: _Scope, depth: int) -> str:
        return {INT: self.integer, STRING: self.string, QUANTITY: self.quantity, SEMVER: self.semver}[kind](
            scope, depth
        )

    def attribute(self, ids: tuple[str, ...]) -> str:
        domain = self.rng.choice(DOMAINS)
        ident = self.rng.choice(ids)
        if self.rng.random() < 0.5:
            return f'device.attributes["{domain}"].{ident}'
        return f'device.attributes["{domain}"]["{ident}"]'

    def string(self, scope: _Scope, depth: int) -> str:
        rng = self.rng
        var = scope.pick(rng, STRING) or scope.pick(rng, DOMAIN_KEY)
        if var and rng.random() < 0.4:
            return var
        if depth <= 0:
            return rng.choice((f'"{rng.choice(WORDS)}"', "device.driver", self.attribute(STRING_IDS)))
        choice = rng.random()
        inner = self.string(scope, depth - 1)
        if choice < 0.15:
            return f"{inner}.lowerAscii()"
        if choice < 0.25:
            return f"{inner}.upperAscii()"
        if choice < 0.35:
            return f'{inner}.replace("{rng.choice(WORDS)}", "{rng.choice(WORDS)}")'
        if choice < 0.45:
            return f"({inner} + {self.string(scope, depth - 1)})"
        if choice < 0.5:
            return f"{inner}.trim()"
        if choice < 0.55:
            return f"{inner}.substring(0)"
        if choice < 0.6:
            return f'{inner}.find("{rng.choice(REGEXES)}")'
        return self.string(scope, 0)

    def integer(self, scope: _Scope, depth: int) -> str:
        rng = self.rng
        var = scope.pick(rng, INT)
        if var and rng.random() < 0.5:
            return var
        if depth <= 0:
            return rng.choice((str(rng.randint(0, 9)), self.attribute(INT_IDS)))
        choice = rng.random()
        if choice < 0.2:
            return f"size({self.string(scope, depth - 1)})"
        if choice < 0.3:
            return f"{self.list_value(rng.choice((LIST_INT, LIST_STRING)), scope, depth - 1)}.size()"
        if choice < 0.4:
            return f"{self.quantity(scope, depth - 1)}.asInteger()"
        if choice < 0.5:
            return f"{self.semver(scope, depth - 1)}.major()"
        if choice < 0.55:
            return f'{self.string(scope, depth - 1)}.indexOf("{rng.choice(WORDS)}")'
        if choice < 0.6:
            return f"{self.list_value(rng.choice((LIST_INT, LIST_STRING)), scope, depth - 1)}.size()"
        if choice < 0.7:
            return f"({self.integer(scope, depth - 1)} + {self.integer(scope, depth - 1)})"
        if choice < 0.75:
            return f'ip("{rng.choice(("10.0.0.1", "::1"))}").family()'
        return self.integer(scope, 0)

    def quantity(self, scope: _Scope, depth: int) -> str:
        rng = self.rng
        var = scope.pick(rng, QUANTITY)
        if var and rng.random() < 0.5:
            return var
        if depth <= 0 or rng.random() < 0.5:
            if rng.random() < 0.5:
                return f'quantity("{rng.choice(QUANTITIES)}")'
            return f'device.capacity["{rng.choice(DOMAINS)}"].{rng.choice(CAPACITY_IDS)}'
        inner = self.quantity(scope, depth - 1)
        if rng.random() < 0.5:
            return f"{inner}.add({self.quantity(scope, depth - 1)})"
        return f"{inner}.sub({rng.randint(0, 9)})"

    def semver(self, scope: _Scope, depth: int) -> str:
        rng = self.rng
        var = scope.pick(rng, SEMVER)
        if var and rng.random() < 0.5:
            return var
        if rng.random() < 0.5:
            return f'semver("{rng.choice(SEMVERS)}")'
        return self.attribute(VERSION_IDS)

    def list_value(self, kind: str, scope: _Scope, depth: int) -> str:
        rng = self.rng
        var = scope.pick(rng, kind)
        if var and rng.random() < 0.5:
            return var
        element = INT if kind == LIST_INT else STRING
        choice = rng.random()
        if depth <= 0 or choice < 0.35:
            # Typed items only: an attribute is dyn, and a literal mixing dyn with int is rejected.
            items = [self.typed_leaf(element, scope) for _ in range(rng.randint(1, 4))]
            return f"[{', '.join(items)}]"
        if kind == LIST_STRING and choice < 0.5:
            return f'{self.string(scope, depth - 1)}.split(",")'
        if kind == LIST_STRING and choice < 0.6:
            return f'{self.string(scope, depth - 1)}.findAll("{rng.choice(REGEXES)}")'
        if kind == LIST_STRING and choice < 0.7:
            rng_expr, _, _ = self.map_range(scope)
            k = self.fresh("k")
            return f"{rng_expr}.map({k}, {k})"
        if kind == LIST_INT and choice < 0.5:
            return f"lists.range({rng.randint(1, 40)})"
        if kind == LIST_INT and choice < 0.6:
            x = self.fresh("x")
            return f"{self.list_value(kind, scope, depth - 1)}.map({x}, {x} * 2)"
        if choice < 0.75:
            x = self.fresh("x")
            inner = self.list_value(kind, scope, depth - 1)
            key = f"-{x}" if kind == LIST_INT else f"size({x})"
            return f"{inner}.sortBy({x}, {key})"
        if choice < 0.85:
            return f"{self.list_value(kind, scope, depth - 1)}.sort()"
        x = self.fresh("x")
        listed = self.list_value(kind, scope, depth - 1)
        return f"{listed}.filter({x}, {self.boolean(scope.bind(x, element), 0)})"

    def typed_leaf(self, kind: str, scope: _Scope) -> str:
        var = scope.pick(self.rng, kind)
        # cel.bind names (b...) may hold an attribute, which is dyn: not in a typed literal.
        if var and not var.startswith("b") and self.rng.random() < 0.4:
            return var
        if kind == INT:
            return str(self.rng.randint(0, 9))
        return self.rng.choice((f'"{self.rng.choice(WORDS)}"', "device.driver"))

    def boolean(self, scope: _Scope, depth: int) -> str:
        rng = self.rng
        if depth <= 0:
            return self.comparison(scope, 0)
        choice = rng.random()
        if choice < 0.15:
            op = rng.choice(("&&", "||"))
            return f"({self.boolean(scope, depth - 1)} {op} {self.boolean(scope, depth - 1)})"
        if choice < 0.2:
            return f"!({self.boolean(scope, depth - 1)})"
        if choice < 0.25:
            return f"({self.boolean(scope, 0)} ? {self.boolean(scope, depth - 1)} : {self.boolean(scope, 0)})"
        if choice < 0.3:
            name = self.fresh("b")
            kind, value = self.any_value(scope, depth - 1)
            return f"cel.bind({name}, {value}, {self.boolean(scope.bind(name, kind), depth - 1)})"
        return self.comparison(scope, depth)

    def comparison(self, scope: _Scope, depth: int) -> str:
        rng = self.rng
        choice = rng.random()
        if choice < 0.12:
            op = rng.choice(("==", "!=", "<", ">="))
            return f"{self.string(scope, depth)} {op} {self.string(scope, depth)}"
        if choice < 0.22:
            op = rng.choice(("==", "<", ">", "<="))
            return f"{self.integer(scope, depth)} {op} {self.integer(scope, depth)}"
        if choice < 0.32:
            method = rng.choice(("startsWith", "endsWith", "contains"))
            return f'{self.string(scope, depth)}.{method}("{rng.choice(WORDS)}")'
        if choice < 0.36:
            return f'{self.string(scope, depth)}.matches("{rng.choice(REGEXES)}")'
        if choice < 0.4:
            # The global form: priced like the member one only since cel-go 0.27 (kube 1.37).
            return f'matches({self.string(scope, depth)}, "{rng.choice(REGEXES)}")'
        if choice < 0.48:
            method = rng.choice(("isGreaterThan", "isLessThan"))
            return f"{self.quantity(scope, depth)}.{method}({self.quantity(scope, depth)})"
        if choice < 0.53:
            return f"{self.quantity(scope, depth)}.compareTo({self.quantity(scope, depth)}) == 0"
        if choice < 0.6:
            method = rng.choice(("isGreaterThan", "isLessThan"))
            return f"{self.semver(scope, depth)}.{method}({self.semver(scope, depth)})"
        if choice < 0.65:
            return f"{self.string(scope, depth)} in {self.list_value(LIST_STRING, scope, depth)}"
        if choice < 0.7:
            return f"{self.integer(scope, depth)} in {self.list_value(LIST_INT, scope, depth)}"
        if choice < 0.75:
            return f'{self.string(scope, depth)} in device.attributes["{rng.choice(DOMAINS)}"]'
        if choice < 0.8:
            return f'has(device.attributes["{rng.choice(DOMAINS)}"].{rng.choice(STRING_IDS)})'
        if choice < 0.85:
            fn = rng.choice(("isQuantity", "isSemver", "isIP", "isCIDR", "isURL"))
            return f"{fn}({self.string(scope, depth)})"
        if choice < 0.88:
            return f'cidr("10.0.0.0/8").containsIP(ip("{rng.choice(("10.1.2.3", "11.0.0.1"))}"))'
        if choice < 0.9:
            address = f'url("https://example.com/{rng.choice(("a", "b"))}")'
            return f"{address}.getHost() == {self.string(scope, depth)}"
        if choice < 0.93:
            return f'device.attributes["{rng.choice(DOMAINS)}"].{rng.choice(BOOL_IDS)} == true'
        if choice < 0.94:
            return f"{self.list_value(LIST_INT, scope, depth)}.isSorted()"
        if choice < 0.95:
            return f"sets.contains({self.list_value(LIST_INT, scope, depth)}, [{rng.randint(0, 9)}])"
        if choice < 0.96:
            lists = (self.list_value(LIST_STRING, scope, depth), self.list_value(LIST_STRING, scope, depth))
            return f'({lists[0]} + {lists[1]}).join("-") == {self.string(scope, depth)}'
        return f'device.driver == "{rng.choice(("gpu.example.com", "x"))}"'


def corpus(size: int, seed: int = 20261201, *, transform_map: bool = False) -> list[str]:
    """`size` distinct expressions, the same for the same seed (and transform_map choice)."""
    generator = Generator(seed, transform_map=transform_map)
    found: dict[str, None] = {}
    while len(found) < size:
        found.setdefault(generator.expression())
    return list(found)


# ---------------------------------------------------------------------- evaluation fleet

FLEET_DRIVER = "gpu.example.com"
FLEET_SIZE = 24  # within resource.k8s.io/v1's 32 results per allocation: `All` may take every one
GPU_MODELS = (  # (model, productName, memory, multiprocessors, watts)
    ("H100", "NVIDIA H100 80GB HBM3", "80Gi", 132, 700),
    ("A100", "NVIDIA A100-SXM4-40GB", "40Gi", 108, 400),
    ("L4", "NVIDIA L4", "24Gi", 58, 72),
)
MIG_PROFILES = (("1g.10gb", "10Gi", 16), ("3g.40gb", "40Gi", 60))
DRIVER_VERSIONS = ("535.104.5", "550.54.15", "560.35.3", "9.0.0", "1.2.3")
COMPUTE_CAPABILITIES = {"H100": "9.0.0", "A100": "8.0.0", "L4": "8.9.0"}


def fleet(size: int = FLEET_SIZE, seed: int = 20261201, *, shareable: bool = True) -> list[dict[str, object]]:
    """resource.k8s.io/v1 devices that differ the way a real node's GPUs do, for evaluating the corpus.

    Whole GPUs and MIG partitions of several models, each with its own UUID, PCI address and
    index, several driver versions (semver); attributes and capacities under the domains and
    ids the generator reads, every name qualified so the fleet means the same under any driver.
    Some devices lack some attributes (productName, driverVersion, mig, the numa domain), so an
    unguarded read errs at run time there; a few carry values the generator does not expect
    (the WORDS it compares with, an int where it reads a string), and with `shareable` a few
    allow multiple allocations. Deterministic for a seed.
    """
    rng = random.Random(seed)
    devices: list[dict[str, object]] = []
    for i in range(size):
        model, product, memory, multiprocessors, watts = rng.choice(GPU_MODELS)
        mig = i % 3 == 2
        gpu = "gpu.example.com/"
        attributes: dict[str, dict[str, object]] = {
            gpu + "model": {"string": model},
            gpu + "uuid": {"string": f"{'MIG' if mig else 'GPU'}-{_uuid(rng)}"},
            gpu + "index": {"int": i % 8},
            gpu + "pciBusID": {"string": f"0000:{0x18 + 0x10 * (i // 3):02x}:00.0"},
            gpu + "driverVersion": {"version": rng.choice(DRIVER_VERSIONS)},
            gpu + "cudaComputeCapability": {"version": COMPUTE_CAPABILITIES[model]},
            gpu + "mig": {"bool": mig},
        }
        capacity: dict[str, dict[str, object]] = {gpu + "memory": {"value": memory}}
        if mig:
            profile, memory, multiprocessors = rng.choice(MIG_PROFILES)
            product = f"{product} MIG {profile}"
            capacity[gpu + "memory"] = {"value": memory}
            attributes[gpu + "parentIndex"] = {"int": i % 8}
        else:
            capacity[gpu + "watts"] = {"value": str(watts)}
        capacity[gpu + "multiprocessors"] = {"value": str(multiprocessors)}
        if rng.random() < 0.8:
            attributes[gpu + "productName"] = {"string": product}
        if rng.random() < 0.15:
            del attributes[gpu + "driverVersion"]
        if rng.random() < 0.15:
            del attributes[gpu + "mig"]
        if i == 1:
            attributes[gpu + "uuid"] = {"string": "gpu-0"}  # one of WORDS: equality and prefix tests hit
        if rng.random() < 0.75:
            numa = "numa.example.org/"
            attributes[numa + "node"] = {"int": (i // 4) % 2}
            attributes[numa + "index"] = {"int": i // 4}
            if rng.random() < 0.3:
                attributes[numa + "model"] = {"string": rng.choice(("a", "abc", model))}
                capacity[numa + "memory"] = {"value": rng.choice(("1k", "500m", "40Gi"))}
        if rng.random() < 0.3:
            other = "other.dev/"
            attributes[other + "productName"] = {"string": rng.choice(("x,y", "", "10.0.0.1", "a"))}
            attributes[other + "mig"] = {"bool": rng.random() < 0.5}
            capacity[other + "watts"] = {"value": rng.choice(("1", "1k"))}
        if i == 5:
            # A string attribute as an int: comparing it as a string is a runtime overload error.
            attributes["other.dev/model"] = {"int": 7}
        device: dict[str, object] = {"name": f"gpu-{i}", "attributes": attributes, "capacity": capacity}
        if shareable and i % 6 == 4:
            device["allowMultipleAllocations"] = True
        devices.append(device)
    return devices


def _uuid(rng: random.Random) -> str:
    hexits = f"{rng.getrandbits(128):032x}"
    return f"{hexits[:8]}-{hexits[8:12]}-{hexits[12:16]}-{hexits[16:20]}-{hexits[20:]}"
