"""The idle-claim state machine: threshold, duration, one Event per idle stretch, unknown counts as busy."""

from __future__ import annotations

from dataclasses import dataclass, field

from draplugin.kubelet.interface import ClaimRef
from draplugin.usage.holders import Holder, PodRef
from draplugin.usage.idle import IDLE_REASON, IdleTracker, format_duration, idle_note

POD = PodRef("team-a", "train-7-pod", "uid-pod")
HOLDER = Holder("team-a", "train-7", "uid-claim", ("gpu-0", "gpu-1"), (POD,))
MODELS = {"gpu-0": "NVIDIA H100 80GB HBM3", "gpu-1": "NVIDIA H100 80GB HBM3"}


@dataclass
class RecordingEvents:
    claims: list[tuple[ClaimRef, str, str, bool]] = field(default_factory=list)
    pods: list[tuple[PodRef, str, str, bool]] = field(default_factory=list)

    def claim_event(
        self, claim: ClaimRef, reason: str, note: str, *, warning: bool = True, action: str = ""
    ) -> None:
        self.claims.append((claim, reason, note, warning))

    def pod_event(
        self, pod: PodRef, reason: str, note: str, *, warning: bool = True, action: str = ""
    ) -> None:
        self.pods.append((pod, reason, note, warning))


def ratios(a: float | None, b: float | None) -> dict[tuple[str, str], float | None]:
    return {("uid-claim", "gpu-0"): a, ("uid-claim", "gpu-1"): b}


def test_idle_after_the_duration_with_one_event_on_the_claim_and_its_pods() -> None:
    events = RecordingEvents()
    tracker = IdleTracker(0.05, 45 * 60, events)
    for minute in range(0, 50, 5):
        (state,) = tracker.update(minute * 60.0, [HOLDER], ratios(0.02, 0.01), MODELS)
        assert state.idle == (minute >= 45)
        assert state.idle_seconds == minute * 60.0
    assert len(events.claims) == 1 and len(events.pods) == 1
    claim, reason, note, warning = events.claims[0]
    assert claim == ClaimRef("team-a", "uid-claim", "train-7")
    assert (reason, warning) == (IDLE_REASON, False)
    assert note == (
        "gpu-0 (NVIDIA H100 80GB HBM3), gpu-1 (NVIDIA H100 80GB HBM3) held by team-a/train-7 "
        "at 2% busy for 45m"
    )
    assert events.pods[0][0] == POD and events.pods[0][2] == note


def test_one_busy_device_keeps_the_claim_busy() -> None:
    tracker = IdleTracker(0.05, 60.0, None)
    for t in range(0, 300, 10):
        (state,) = tracker.update(float(t), [HOLDER], ratios(0.01, 0.5), MODELS)
        assert (state.idle, state.idle_seconds) == (False, 0.0)


def test_busy_again_resets_and_the_next_idle_stretch_gets_a_new_event() -> None:
    events = RecordingEvents()
    tracker = IdleTracker(0.05, 60.0, events)
    tracker.update(0.0, [HOLDER], ratios(0.0, 0.0), MODELS)
    assert tracker.update(60.0, [HOLDER], ratios(0.0, 0.0), MODELS)[0].idle
    assert tracker.update(70.0, [HOLDER], ratios(0.0, 0.0), MODELS)[0].idle  # still idle: no second event
    assert len(events.claims) == 1
    busy = tracker.update(80.0, [HOLDER], ratios(0.9, 0.0), MODELS)[0]
    assert (busy.idle, busy.idle_seconds) == (False, 0.0)
    tracker.update(90.0, [HOLDER], ratios(0.0, 0.0), MODELS)
    assert not tracker.update(100.0, [HOLDER], ratios(0.0, 0.0), MODELS)[0].idle
    assert tracker.update(150.0, [HOLDER], ratios(0.0, 0.0), MODELS)[0].idle
    assert len(events.claims) == 2


def test_the_threshold_is_exclusive() -> None:
    tracker = IdleTracker(0.05, 0.0, None)
    assert not tracker.update(0.0, [HOLDER], ratios(0.05, 0.0), MODELS)[0].idle
    assert tracker.update(1.0, [HOLDER], ratios(0.049, 0.0), MODELS)[0].idle


def test_unknown_utilization_is_never_called_idle() -> None:
    tracker = IdleTracker(0.05, 0.0, None)
    assert not tracker.update(0.0, [HOLDER], ratios(None, 0.0), MODELS)[0].idle
    assert not tracker.update(1.0, [HOLDER], {}, MODELS)[0].idle


def test_an_unprepared_claim_is_forgotten() -> None:
    events = RecordingEvents()
    tracker = IdleTracker(0.05, 10.0, events)
    tracker.update(0.0, [HOLDER], ratios(0.0, 0.0), MODELS)
    assert tracker.update(5.0, [], {}, MODELS) == []
    # Prepared again: a fresh stretch, counted from now.
    assert tracker.update(6.0, [HOLDER], ratios(0.0, 0.0), MODELS)[0].idle_seconds == 0.0


def test_durations_read_the_way_people_say_them() -> None:
    assert [format_duration(s) for s in (30, 60, 45 * 60, 3600, 3900)] == ["30s", "1m", "45m", "1h", "1h5m"]
    one = Holder("team-a", "train-7", "u", ("gpu-0",))
    assert idle_note(one, {"gpu-0": "NVIDIA H100 80GB HBM3"}, 0.02, 2700) == (
        "gpu-0 (NVIDIA H100 80GB HBM3) held by team-a/train-7 at 2% busy for 45m"
    )
