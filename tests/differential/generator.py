"""Random differential scenarios for one release, from a seeded `random.Random`.

What a scenario may hold follows what the release's kube-scheduler honours (`Features`: its
defaults plus the cluster's gates), so a field the cluster would drop or reject never appears:
several nodes per pod; pools in one slice, split over two, or incomplete (a slice still to
come); allocationMode All; counters shared by partitionable devices (in the devices' slice on
1.34, in a slice of their own from 1.35 on, as the API demands); devices with consumable
capacity; NoSchedule device taints and tolerations; admin access; prioritized lists
(firstAvailable); devices held by earlier claims; selectors that fail at run time (an attribute
some devices lack, read without a `has` guard).

Left out on purpose: on 1.34 (with DRAConsumableCapacity on) pools of two or more present
slices, which panic kube-scheduler 1.34.4 (`index out of range` in the experimental allocator's
CmpRequestOverCapacity, All mode or not: the differential's first 1.34 run took the scheduler
down on a plain count-3 request), and shareable devices (allowMultipleAllocations), where a
request for two devices picks the pool's last device twice and indexes past its slice (the
second 1.34 run); either would stop the whole run;
NoExecute taints (the eviction controller deletes pods: eviction, not allocation).
"""

from __future__ import annotations

import random
from typing import Any

from controller.allocation.builders import (
    claim,
    device,
    device_class,
    exactly,
    first_available,
    resource_slice,
)
from controller.allocation.features import Features
from tests.differential.scenario import JSON, SCENARIO_LABEL, Scenario, driver_name

MODELS = ("h100", "a100", "l4")
TAINT = {"key": "maintenance", "value": "x", "effect": "NoSchedule"}


def generate(rng: random.Random, tag: str, minor: int, features: Features) -> Scenario:
    return _Generator(rng, tag, minor, features).scenario()


class _Generator:
    def __init__(self, rng: random.Random, tag: str, minor: int, features: Features) -> None:
        self.rng, self.tag, self.minor, self.features = rng, tag, minor, features
        self.driver = driver_name(tag)
        self.uses_all = rng.random() < 0.25
        # Shareable devices (allowMultipleAllocations) panic kube-scheduler 1.34.4 as well (see
        # the module doc); there consumable capacity is exercised by capacity requests alone.
        self.consumable = features.consumable_capacity and minor >= 35 and rng.random() < 0.3
        self.partitionable = features.partitionable_devices and rng.random() < 0.25
        # A selector that reads `memory` unguarded errs on a device without it.
        self.cel_errors = rng.random() < 0.12

    def scenario(self) -> Scenario:
        nodes = [f"{self.tag}-n{i}" for i in range(self.rng.choice((1, 2, 2, 3)))]
        slices: list[JSON] = []
        for node in nodes:
            slices += self.node_slices(node)
        classes = [device_class(f"{self.tag}-any", [f'device.driver == "{self.driver}"'])]
        if self.rng.random() < 0.3:
            model = self.rng.choice(MODELS)
            classes.append(
                device_class(
                    f"{self.tag}-model",
                    [
                        f'device.driver == "{self.driver}"',
                        f'device.attributes["{self.driver}"].model == "{model}"',
                    ],
                )
            )
        for c in classes:
            c["metadata"]["labels"] = {SCENARIO_LABEL: self.tag}
        claims = [self.claim(f"{self.tag}-claim{i}", classes) for i in range(self.rng.choice((1, 1, 1, 2)))]
        return Scenario(
            tag=self.tag,
            minor=self.minor,
            nodes=nodes,
            slices=slices,
            classes=classes,
            claims=claims,
            blockers=self.blockers(slices, classes[0]["metadata"]["name"]),
        )

    # ----- devices and slices

    def device(self, name: str, counter_set: str | None) -> JSON:
        rng = self.rng
        attributes: dict[str, object] = {"model": rng.choice(MODELS), "numa": rng.randint(0, 1)}
        if rng.random() < 0.7:
            attributes["memory"] = rng.choice((40, 80))
        extra: dict[str, Any] = {}
        if self.features.device_taints and rng.random() < 0.12:
            extra["taints"] = [dict(TAINT)]
        if counter_set is not None and rng.random() < 0.7:
            extra["consumesCounters"] = [
                {"counterSet": counter_set, "counters": {"memory": {"value": rng.choice(("40Gi", "80Gi"))}}}
            ]
        capacity: dict[str, Any] = {}
        if rng.random() < 0.5:
            capacity["memory"] = {"value": rng.choice(("40Gi", "80Gi"))}
        if self.consumable and rng.random() < 0.5:
            extra["allowMultipleAllocations"] = True
            memory: dict[str, Any] = {"value": "80Gi"}
            if rng.random() < 0.5:
                memory["requestPolicy"] = {"default": "20Gi", "validRange": {"min": "10Gi", "step": "10Gi"}}
            capacity["memory"] = memory
        result = device(name, attributes, **extra)
        if capacity:  # set here: device()'s capacity argument takes plain values only
            result["capacity"] = capacity
        return result

    def node_slices(self, node: str) -> list[JSON]:
        rng = self.rng
        counter_set = f"{node}-counters" if self.partitionable else None
        devices = [self.device(f"gpu-{i}", counter_set) for i in range(rng.randint(1, 5))]
        layout = rng.choices(("one", "split", "incomplete"), weights=(6, 2, 1.5))[0]
        # Devices split over two slices are searched in an order kube-scheduler does not fix
        # (its pools and slices come from maps): keep selectors that may err away from them, or
        # whether the search meets the failing device first would be chance.
        if layout == "split" and (
            len(devices) < 2
            or self.cel_errors
            or self.avoid_multi_slice_pools()
            or (counter_set is not None and self.counters_same_slice())
        ):
            layout = "one"
        parts = (
            [devices] if layout != "split" else [devices[: len(devices) // 2], devices[len(devices) // 2 :]]
        )
        counters = [{"name": counter_set, "counters": {"memory": {"value": "80Gi"}}}] if counter_set else []
        separate_counters = bool(counters) and not self.counters_same_slice()
        if separate_counters and self.avoid_multi_slice_pools():
            # A counter slice makes a second present slice; drop the counters instead.
            for d in devices:
                d.pop("consumesCounters", None)
            counters, separate_counters = [], False
        present = len(parts) + (1 if separate_counters else 0)
        count = present + (1 if layout == "incomplete" else 0)
        slices: list[JSON] = []
        for i, part in enumerate(parts):
            extra: dict[str, Any] = {}
            if counters and not separate_counters:
                extra["sharedCounters"] = counters
            slices.append(resource_slice(f"{node}-s{i}", part, node=node, pool=node, driver=self.driver,
                                         slice_count=count, **extra))  # fmt: skip
        if separate_counters:
            slices.append(resource_slice(f"{node}-counters", [], node=node, pool=node, driver=self.driver,
                                         slice_count=count, sharedCounters=counters))  # fmt: skip
            del slices[-1]["spec"]["devices"]  # a counter slice has no devices, not even []
        for s in slices:
            s["metadata"]["labels"] = {SCENARIO_LABEL: self.tag}
        return slices

    def counters_same_slice(self) -> bool:
        # 1.34's API keeps counter sets beside the devices that consume them; 1.35 on, apart.
        return self.minor <= 34

    def avoid_multi_slice_pools(self) -> bool:
        # kube-scheduler 1.34.4 with DRAConsumableCapacity panics on a pool of several present
        # slices (CmpRequestOverCapacity indexes the wrong slice's devices), All mode or not.
        return self.minor <= 34 and self.features.consumable_capacity

    # ----- claims

    def selectors(self) -> list[str]:
        rng, d = self.rng, self.driver
        selectors = []
        if rng.random() < 0.35:
            selectors.append(f'device.attributes["{d}"].model == "{rng.choice(MODELS)}"')
        if self.cel_errors and rng.random() < 0.6:
            selectors.append(f'device.attributes["{d}"].memory >= {rng.choice((40, 80))}')
        elif rng.random() < 0.25:
            selectors.append(f'"memory" in device.attributes["{d}"] && device.attributes["{d}"].memory >= 80')
        return selectors

    def spec(self, name: str, classes: list[JSON], top_level: bool) -> JSON:
        rng = self.rng
        extra: dict[str, Any] = {}
        if self.features.device_taints and rng.random() < 0.2:
            extra["tolerations"] = [{"key": "maintenance", "operator": "Exists"}]
        if self.features.consumable_capacity and rng.random() < (0.5 if self.consumable else 0.1):
            extra["capacity"] = {"requests": {"memory": rng.choice(("10Gi", "20Gi", "40Gi", "50Gi"))}}
        if top_level and self.features.admin_access and rng.random() < 0.07:
            extra["adminAccess"] = True
        class_name = rng.choice(classes)["metadata"]["name"]
        if self.uses_all and rng.random() < 0.5:
            return exactly(name, class_name, mode="All", selectors=self.selectors(), **extra)
        return exactly(name, class_name, count=rng.choice((1, 1, 2, 3)), selectors=self.selectors(), **extra)

    def claim(self, name: str, classes: list[JSON]) -> JSON:
        rng = self.rng
        requests = []
        for r in range(rng.choice((1, 1, 2))):
            if self.features.prioritized_list and rng.random() < 0.3:
                subs = [self.spec(f"s{i}", classes, top_level=False) for i in range(rng.choice((2, 2, 3)))]
                requests.append(first_available(f"r{r}", *subs))
            else:
                requests.append(self.spec(f"r{r}", classes, top_level=True))
        constraints = []
        if rng.random() < 0.25:
            constraints.append({"matchAttribute": f"{self.driver}/numa"})
        elif rng.random() < 0.15:
            constraints.append({"distinctAttribute": f"{self.driver}/numa"})
        return claim(name, requests, namespace="", constraints=constraints)

    def blockers(self, slices: list[JSON], class_name: str) -> list[JSON]:
        """Earlier claims that hold a whole device each (never a shareable one: those take shares)."""
        rng = self.rng
        candidates = [
            (s["spec"]["nodeName"], s["spec"]["pool"]["name"], d["name"])
            for s in slices
            for d in s["spec"].get("devices") or []
            if not d.get("allowMultipleAllocations")
        ]
        if not candidates or rng.random() > 0.35:
            return []
        held = rng.sample(candidates, min(len(candidates), rng.choice((1, 1, 2))))
        result = []
        for i, (node, pool, name) in enumerate(held):
            blocker = claim(f"{self.tag}-held{i}", [exactly("gpu", class_name)], namespace="")
            blocker["status"] = {
                "allocation": {
                    "devices": {"results": [
                        {"request": "gpu", "driver": self.driver, "pool": pool, "device": name}
                    ]},
                    "nodeSelector": {"nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                    ]},
                }
            }  # fmt: skip
            result.append(blocker)
        return result
