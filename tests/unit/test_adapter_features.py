"""How a backend's optional features are found (adapters/base.py ``features_of``, issue #46):
pure, no cluster. The real adapters' features are exercised against their clusters by the
contract suite and tests/dispatch."""

from __future__ import annotations

import pytest

from adapters.base import (
    Backend,
    Feature,
    JobNotFound,
    Unsupported,
    WithOutputFiles,
    features_of,
    register,
)
from adapters.slurm.errors import AlreadyDone, classify, error_from, stop


class Plain(Backend):
    """Only the required interface."""

    name = "test-plain"

    def submit(self, request): raise NotImplementedError
    def status(self, backend_job_id): raise NotImplementedError
    def cancel(self, backend_job_id): raise NotImplementedError
    def capacity(self): raise NotImplementedError
    def find_by_gateway_id(self, gateway_job_id, *, request=None): raise NotImplementedError


class Streams(Plain):
    """Has stream_output without naming WithOutputStream: having the method is having the feature."""

    def stream_output(self, backend_job_id, worker, *, tail_lines=None, follow=False):
        return iter(())


def test_a_backend_with_only_the_required_interface_lacks_every_optional_one_and_says_why():
    f = features_of(Plain())
    for feature in (Feature.WATCH, Feature.OUTPUT_FILES, Feature.OUTPUT_STREAM, Feature.LISTING,
                    Feature.RESERVATIONS, Feature.PREEMPT_SIGNAL):
        assert not f.has(feature) and f.why_not(feature)
    assert f.why_not(Feature.OUTPUT_FILES) == "this pool's job output is not readable by the gateway"
    assert f.why_not(Feature.RESERVATIONS) == "test-plain has no advance reservations of its own"
    assert f.has(Feature.CONTAINER_IMAGE) and f.why_not(Feature.CONTAINER_IMAGE) == ""
    assert not f.node_exclusive


def test_having_the_methods_is_having_the_feature():
    f = features_of(Streams())
    assert f.has(Feature.OUTPUT_STREAM) and not f.has(Feature.OUTPUT_FILES)


def test_a_backend_that_cannot_use_an_interface_as_configured_says_so_the_same_way():
    class NoStreamHere(Streams):
        def unsupported(self):
            return {Feature.OUTPUT_STREAM: "this transport keeps no output", Feature.GPU_TYPE: "one GPU type only"}

    f = features_of(NoStreamHere())
    assert not f.has(Feature.OUTPUT_STREAM) and f.why_not(Feature.OUTPUT_STREAM) == "this transport keeps no output"
    with pytest.raises(Unsupported, match="one GPU type only") as err:
        f.require(Feature.GPU_TYPE)
    assert err.value.backend == "test-plain"


def test_node_exclusivity_is_the_adapters_whatever_the_pool_is_called():
    assert features_of("slurm").node_exclusive and not features_of("kubernetes").node_exclusive
    assert not features_of("no-such-kind").node_exclusive and not features_of(None).node_exclusive
    assert not features_of("no-such-kind").has(Feature.WATCH)
    from adapters.slurm import SlurmBackend

    assert features_of(SlurmBackend).node_exclusive
    # The adapter of a kind, read without a built backend (a pool's stored row, the simulator).
    assert features_of("slurm").has(Feature.PREEMPT_SIGNAL) and features_of("kubernetes").has(Feature.WATCH)


def test_the_registry_refuses_an_adapter_that_names_an_interface_without_its_method():
    class Half(Plain, WithOutputFiles):
        name = "test-half"
        settings_class = dict

    with pytest.raises(TypeError, match="output_file"):
        register(Half)


# ------------------------------------------- Slurm: stopping a finished or unknown job succeeds


@pytest.mark.parametrize("error", [
    classify("Job/step already completing or completed"),
    classify("some words", 2021),  # ESLURM_ALREADY_DONE
    classify("Invalid job id specified"),
    classify("whatever", 2017),  # ESLURM_INVALID_JOB_ID
    error_from({"errors": [{"error": "Unspecified error", "error_number": 9001},
                           {"error": "Job/step already completing or completed", "error_number": 2021}]}),
])
def test_stopping_a_finished_or_unknown_job_succeeds_on_every_transport(error):
    def call():
        raise error

    assert isinstance(error, (AlreadyDone, JobNotFound))
    stop(call)  # no error


def test_any_other_stop_failure_is_raised():
    error = classify("Unable to contact slurm controller (connect failure)")

    def call():
        raise error

    with pytest.raises(type(error)):
        stop(call)
    # Outside a stop a late answer is what it was before: an unavailable backend, retried.
    assert classify("Job/step already completing or completed").retryable
