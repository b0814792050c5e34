"""The simulated fleet: pods, tier capacities, model and hardware profile.

Capacities are in tokens. `None` means "the default": GPU from the profile's KV pool, CPU from
`knobs.cpu_gib`, L2 from the profile's pool size, each converted with the model's KV bytes per
token. A capacity of 0 disables that tier.
"""
from __future__ import annotations

import dataclasses

from contracts.knobs import Knobs
from simulator.models import GIB, ModelError, ModelSpec, get_model
from simulator.profile import DEFAULT_PROFILE, HardwareProfile, ProfileError, get_profile

MAX_PODS = 1024


class ClusterError(ValueError):
    """An invalid or impossible cluster setting; the message names the setting and the limit."""


@dataclasses.dataclass(frozen=True)
class RouterSettings:
    """Parameters of the routing strategies (the strategy itself is the `router` knob).

    prefix_load_ratio / prefix_load_slack: `prefixaware` load cap. A pod may take a request for
    its cached prefix only while its in-flight requests <= ratio x (fleet minimum) + slack;
    otherwise the longest prefix among the pods under the cap wins.
    """

    prefix_load_ratio: float = 1.5
    prefix_load_slack: int = 4

    def __post_init__(self) -> None:
        if not self.prefix_load_ratio >= 1.0:
            raise ClusterError(f"prefix_load_ratio: must be >= 1.0, got {self.prefix_load_ratio!r}")
        if not (isinstance(self.prefix_load_slack, int) and self.prefix_load_slack >= 0):
            raise ClusterError(f"prefix_load_slack: must be an integer >= 0, got {self.prefix_load_slack!r}")


@dataclasses.dataclass(frozen=True)
class Capacities:
    """Resolved per-tier capacities, in tokens (GPU and CPU per pod, L2 for the fleet)."""

    gpu_tokens: int
    cpu_tokens: int
    l2_tokens: int
    kv_bytes_per_token: int


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    pods: int = 4
    gpu_tokens: int | None = None
    cpu_tokens: int | None = None
    l2_tokens: int | None = None
    model: str | None = None  # None: the profile's model
    profile: str | HardwareProfile = DEFAULT_PROFILE
    router: RouterSettings = RouterSettings()
    pod_names: tuple[str, ...] | None = None  # default pod-0 .. pod-N-1
    # the load term: observed queueing the fleet has beyond what the twin models (the agent sets it
    # from vLLM's num_requests_waiting by Little's law); added to every request's queue delay and TTFT
    load_delay_s: float = 0.0
    # The tiers below the GPU behave as vLLM's native tiering (OffloadingConnector with
    # TieringOffloadingSpec), not as LMCache (False). vLLM frees a request's KV blocks tail first and
    # its CPU tier re-ranks a finished request's chunks tail first, so a prompt's prefix outlives its
    # tail (LMCache stores chunks in prompt order: head first); and a request that loads nothing from
    # the CPU or fs tier offers its whole prompt to the CPU tier, its KV-cache hits included (stored
    # when absent, refreshed when present), where LMCache stores only the computed chunks.
    native_tiering: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.pods, bool) or not isinstance(self.pods, int) or not 1 <= self.pods <= MAX_PODS:
            raise ClusterError(f"pods: must be an integer in 1..{MAX_PODS}, got {self.pods!r}")
        for key in ("gpu_tokens", "cpu_tokens", "l2_tokens"):
            v = getattr(self, key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ClusterError(f"{key}: must be an integer >= 0 (0 disables the tier), got {v!r}")
        if isinstance(self.load_delay_s, bool) or not isinstance(self.load_delay_s, (int, float)) \
                or not 0.0 <= self.load_delay_s < float("inf"):
            raise ClusterError(f"load_delay_s: must be a finite number >= 0, got {self.load_delay_s!r}")
        if not isinstance(self.native_tiering, bool):
            raise ClusterError(f"native_tiering: must be true or false, got {self.native_tiering!r}")
        if self.pod_names is not None and (
            len(self.pod_names) != self.pods or len(set(self.pod_names)) != self.pods
        ):
            raise ClusterError(f"pod_names: need {self.pods} distinct names, got {list(self.pod_names)!r}")
        try:
            prof = get_profile(self.profile)
            get_model(self.model or prof.model)
        except (ProfileError, ModelError) as exc:
            raise ClusterError(str(exc)) from None

    @property
    def hardware(self) -> HardwareProfile:
        return get_profile(self.profile)

    @property
    def model_spec(self) -> ModelSpec:
        return get_model(self.model or self.hardware.model)

    @property
    def names(self) -> tuple[str, ...]:
        return self.pod_names or tuple(f"pod-{i}" for i in range(self.pods))

    def capacities(self, knobs: Knobs, profile: HardwareProfile | None = None) -> Capacities:
        """Resolve defaults and check the capacities fit the hardware."""
        prof = profile or self.hardware
        model = self.model_spec
        bpt = model.kv_bytes_per_token
        gpu = model.tokens_for_gib(prof.gpu_kv_gib) if self.gpu_tokens is None else self.gpu_tokens
        cpu = model.tokens_for_gib(knobs.cpu_gib) if self.cpu_tokens is None else self.cpu_tokens
        l2 = model.tokens_for_gib(prof.l2_pool_gib) if self.l2_tokens is None else self.l2_tokens
        gpu_room = prof.gpu_memory_gib - model.weights_gib
        if gpu * bpt > gpu_room * GIB:
            raise ClusterError(
                f"gpu capacity: {gpu:,} tokens of {model.name} need {gpu * bpt / GIB:.1f} GiB, but a "
                f"{prof.name} GPU has {prof.gpu_memory_gib:g} GiB of which the weights take "
                f"{model.weights_gib:g} GiB (at most {max(gpu_room, 0):.1f} GiB, "
                f"{model.tokens_for_gib(max(gpu_room, 0)):,} tokens)"
            )
        if cpu * bpt > prof.host_memory_gib * GIB:
            raise ClusterError(
                f"cpu capacity: {cpu * bpt / GIB:.1f} GiB per pod exceeds the {prof.name} host memory "
                f"of {prof.host_memory_gib:g} GiB per pod"
            )
        return Capacities(gpu_tokens=gpu, cpu_tokens=cpu, l2_tokens=l2, kv_bytes_per_token=bpt)
