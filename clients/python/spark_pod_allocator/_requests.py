"""Requests of the API's methods, built the same way by the sync and async clients."""

from __future__ import annotations

from typing import Iterable, Mapping, Optional

from spark_pod_allocator.v1 import allocator_pb2 as pb

# The proto's own field names: a setting added to the API is accepted as soon as the
# stubs are regenerated.
SETTING_FIELDS = tuple(field.name for field in pb.AllocationSettings.DESCRIPTOR.fields)


def start(
    application_id: str,
    namespace: str,
    executor_pod_template: str,
    driver_pod_name: str,
    pod_name_prefix: str,
    settings: Optional[Mapping[str, object]],
    resource_profile_templates: Optional[Mapping[int, str]],
    executor_claim_templates: Optional[Iterable[str]] = None,
) -> pb.StartRequest:
    unknown = set(settings or {}) - set(SETTING_FIELDS)
    if unknown:
        raise ValueError(f"unknown settings: {sorted(unknown)}")
    return pb.StartRequest(
        application_id=application_id,
        namespace=namespace,
        executor_pod_template=executor_pod_template,
        driver_pod_name=driver_pod_name,
        pod_name_prefix=pod_name_prefix,
        settings=pb.AllocationSettings(**dict(settings or {})),  # type: ignore[arg-type]
        resource_profile_templates=dict(resource_profile_templates or {}),
        executor_claim_templates=list(executor_claim_templates or []),
    )


def set_total_expected(
    application_id: str,
    executors_per_profile: Mapping[int, int],
    resource_profile_templates: Optional[Mapping[int, str]],
) -> pb.SetTotalExpectedRequest:
    return pb.SetTotalExpectedRequest(
        application_id=application_id,
        executors_per_profile=dict(executors_per_profile),
        resource_profile_templates=dict(resource_profile_templates or {}),
    )


def is_deleted(application_id: str, executor_id: object) -> pb.IsDeletedRequest:
    return pb.IsDeletedRequest(application_id=application_id, executor_id=str(executor_id))


def update_registered_executors(
    application_id: str, executor_ids: Iterable[object]
) -> pb.UpdateRegisteredExecutorsRequest:
    return pb.UpdateRegisteredExecutorsRequest(
        application_id=application_id, executor_ids=[str(i) for i in executor_ids]
    )
