"""Drives a real `spark-pod-allocator serve --simulate` process over gRPC."""

from __future__ import annotations

import json

import grpc
import pytest

from spark_pod_allocator import AllocatorClient, AllocatorError, pb

from conftest import TEMPLATE
from conftest import wait_until as _wait_until

def test_start_scale_status_is_deleted_stop(service):
    with AllocatorClient(service) as client:
        started = client.start(
            "py-app-1",
            "default",
            executor_pod_template=TEMPLATE,
            settings={"batch_size": 2, "batch_delay_ms": 200},
        )
        assert started.resumed is False
        assert started.last_executor_id == 0

        client.set_total_expected("py-app-1", {0: 3})

        def three_running():
            status = client.get_status("py-app-1")
            profile = [p for p in status.profiles if p.resource_profile_id == 0]
            return profile and profile[0].running == 3 and profile[0].target == 3

        _wait_until(three_running, "3 running executors")
        status = client.get_status("py-app-1")
        # batch size 2 and target 3: ids 1..3 used, none wasted.
        assert status.last_executor_id == 3
        client.update_registered_executors("py-app-1", [1, 2, 3])
        assert client.is_deleted("py-app-1", 1) is False

        # Start again: idempotent, reports the application as resumed.
        again = client.start(
            "py-app-1",
            "default",
            executor_pod_template=TEMPLATE,
            settings={"batch_size": 2, "batch_delay_ms": 200},
        )
        assert again.resumed is True
        assert again.last_executor_id == 3
        # ... but only when it repeats the first: other settings are refused, named.
        with pytest.raises(AllocatorError) as err:
            client.start("py-app-1", "default", executor_pod_template=TEMPLATE)
        assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert err.value.details.startswith("settings.batch_size: ")

        assert client.stop("py-app-1") == 3
        with pytest.raises(AllocatorError) as err:
            client.get_status("py-app-1")
        assert err.value.code == grpc.StatusCode.NOT_FOUND


def test_bad_input_is_reported_with_the_field(service):
    with AllocatorClient(service) as client:
        with pytest.raises(AllocatorError) as err:
            client.start("bad id!", "default", executor_pod_template=TEMPLATE)
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "application_id" in err.value.details

        client.start("py-app-2", "default", executor_pod_template=TEMPLATE)
        with pytest.raises(AllocatorError) as err:
            client.is_deleted("py-app-2", "seven")
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "executor_id" in err.value.details
        assert client.stop("py-app-2") == 0

        with pytest.raises(AllocatorError) as err:
            client.stop("never-started")
        assert err.value.code == grpc.StatusCode.NOT_FOUND


GPU_TEMPLATE = TEMPLATE.replace("spark:4.0.0", "spark-gpu:4.0.0")


def test_profiles_added_after_start_bring_their_template(service):
    with AllocatorClient(service) as client:
        client.start(
            "py-app-3",
            "default",
            executor_pod_template=TEMPLATE,
            settings={
                "executor_container_name": "spark-kubernetes-executor",
                "check_all_containers": True,
            },
        )
        client.set_total_expected("py-app-3", {1: 1}, resource_profile_templates={1: GPU_TEMPLATE})

        def profile_1_has_one():
            profiles = client.get_status("py-app-3").profiles
            targets = [(p.resource_profile_id, p.target) for p in profiles]
            alive = {p.resource_profile_id: p.running + p.pending for p in profiles}
            return targets == [(0, 0), (1, 1)] and alive.get(1) == 1

        _wait_until(profile_1_has_one, "an executor of profile 1")
        # The same template again is fine; another one is refused, naming the field.
        client.set_total_expected("py-app-3", {1: 1}, resource_profile_templates={1: GPU_TEMPLATE})
        with pytest.raises(AllocatorError) as err:
            client.set_total_expected("py-app-3", {1: 2}, resource_profile_templates={1: TEMPLATE})
        assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert err.value.details.startswith("resource_profile_templates[1]: ")
        assert client.stop("py-app-3") == 1


def test_watch_executors_streams_the_state_then_changes_and_ends_on_stop(service):
    kinds = pb.ExecutorEventKind
    with AllocatorClient(service) as client:
        with pytest.raises(AllocatorError) as err:
            next(client.watch_executors("never-started"))
        assert err.value.code == grpc.StatusCode.NOT_FOUND

        client.start(
            "py-app-4",
            "default",
            executor_pod_template=TEMPLATE,
            settings={"batch_delay_ms": 200},
        )
        client.set_total_expected("py-app-4", {0: 2})
        events = client.watch_executors("py-app-4")
        # The state as it is now (possibly empty), closed by SYNCED; then changes until
        # both executors run (the simulator's kubelets start them).
        first = next(events)
        known = {}
        event = first
        while event.kind == kinds.EXECUTOR_EVENT_KIND_SNAPSHOT:
            known[event.executor.executor_id] = event.executor
            event = next(events)
        assert event.kind == kinds.EXECUTOR_EVENT_KIND_SYNCED
        synced = event.sequence
        last = synced
        while sorted(
            e.executor_id for e in known.values() if e.state == pb.EXECUTOR_POD_STATE_RUNNING
        ) != [1, 2]:
            event = next(events)
            assert event.kind == kinds.EXECUTOR_EVENT_KIND_UPDATED, event
            assert event.sequence == last + 1
            last = event.sequence
            known[event.executor.executor_id] = event.executor
        pod = json.loads(known[1].pod_json)
        assert pod["metadata"]["name"] == known[1].pod_name
        assert pod["metadata"]["labels"]["spark-exec-id"] == "1"
        assert pod["status"]["phase"] == "Running"
        events.close()

        # Resumed from the SYNCED sequence: the same changes again, no full state.
        resumed = client.watch_executors("py-app-4", since=synced)
        replay = next(resumed)
        assert replay.kind == kinds.EXECUTOR_EVENT_KIND_UPDATED
        assert replay.sequence == synced + 1

        assert client.stop("py-app-4") == 2
        # Deletes may still come; then the iteration ends by itself.
        rest = list(resumed)
        assert all(e.kind != kinds.EXECUTOR_EVENT_KIND_SNAPSHOT for e in rest)


def _claim(size):
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "py-claims-exec-{{EXECUTOR_ID}}-pvc-0"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": size}},
            },
        }
    )


def test_executor_claim_templates_are_sent_and_checked(service):
    with AllocatorClient(service) as client:
        # Beyond the service's pod_policy.max_claim_size (1Ti): refused, naming the field.
        with pytest.raises(AllocatorError) as err:
            client.start(
                "py-claims",
                "default",
                executor_pod_template=TEMPLATE,
                executor_claim_templates=[_claim("2Ti")],
            )
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "executor_claim_templates[0]" in err.value.details

        started = client.start(
            "py-claims",
            "default",
            executor_pod_template=TEMPLATE,
            executor_claim_templates=[_claim("10Gi")],
        )
        assert started.resumed is False
        # A repeated Start must repeat the claims too.
        with pytest.raises(AllocatorError) as err:
            client.start("py-claims", "default", executor_pod_template=TEMPLATE)
        assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "executor_claim_templates" in err.value.details
        assert client.stop("py-claims") == 0
