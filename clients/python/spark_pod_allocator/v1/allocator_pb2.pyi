from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AllocationPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ALLOCATION_POLICY_UNSPECIFIED: _ClassVar[AllocationPolicy]
    ALLOCATION_POLICY_SPARK: _ClassVar[AllocationPolicy]
    ALLOCATION_POLICY_ADAPTIVE: _ClassVar[AllocationPolicy]

class ExecutorEventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXECUTOR_EVENT_KIND_UNSPECIFIED: _ClassVar[ExecutorEventKind]
    EXECUTOR_EVENT_KIND_SNAPSHOT: _ClassVar[ExecutorEventKind]
    EXECUTOR_EVENT_KIND_SYNCED: _ClassVar[ExecutorEventKind]
    EXECUTOR_EVENT_KIND_UPDATED: _ClassVar[ExecutorEventKind]
    EXECUTOR_EVENT_KIND_DELETED: _ClassVar[ExecutorEventKind]
    EXECUTOR_EVENT_KIND_RECLAIM: _ClassVar[ExecutorEventKind]

class ExecutorPodState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXECUTOR_POD_STATE_UNSPECIFIED: _ClassVar[ExecutorPodState]
    EXECUTOR_POD_STATE_PENDING: _ClassVar[ExecutorPodState]
    EXECUTOR_POD_STATE_RUNNING: _ClassVar[ExecutorPodState]
    EXECUTOR_POD_STATE_SUCCEEDED: _ClassVar[ExecutorPodState]
    EXECUTOR_POD_STATE_FAILED: _ClassVar[ExecutorPodState]
    EXECUTOR_POD_STATE_DELETED: _ClassVar[ExecutorPodState]
    EXECUTOR_POD_STATE_TERMINATING: _ClassVar[ExecutorPodState]
    EXECUTOR_POD_STATE_UNKNOWN: _ClassVar[ExecutorPodState]
ALLOCATION_POLICY_UNSPECIFIED: AllocationPolicy
ALLOCATION_POLICY_SPARK: AllocationPolicy
ALLOCATION_POLICY_ADAPTIVE: AllocationPolicy
EXECUTOR_EVENT_KIND_UNSPECIFIED: ExecutorEventKind
EXECUTOR_EVENT_KIND_SNAPSHOT: ExecutorEventKind
EXECUTOR_EVENT_KIND_SYNCED: ExecutorEventKind
EXECUTOR_EVENT_KIND_UPDATED: ExecutorEventKind
EXECUTOR_EVENT_KIND_DELETED: ExecutorEventKind
EXECUTOR_EVENT_KIND_RECLAIM: ExecutorEventKind
EXECUTOR_POD_STATE_UNSPECIFIED: ExecutorPodState
EXECUTOR_POD_STATE_PENDING: ExecutorPodState
EXECUTOR_POD_STATE_RUNNING: ExecutorPodState
EXECUTOR_POD_STATE_SUCCEEDED: ExecutorPodState
EXECUTOR_POD_STATE_FAILED: ExecutorPodState
EXECUTOR_POD_STATE_DELETED: ExecutorPodState
EXECUTOR_POD_STATE_TERMINATING: ExecutorPodState
EXECUTOR_POD_STATE_UNKNOWN: ExecutorPodState

class AllocationSettings(_message.Message):
    __slots__ = ("batch_size", "batch_delay_ms", "executor_timeout_ms", "executor_idle_timeout_ms", "max_pending_pods", "max_pending_pods_per_profile", "max_executors", "delete_on_termination", "executor_container_name", "check_all_containers", "policy", "stuck_pending_timeout_ms", "min_executors_at_once", "driver_owns_claims", "reuse_claims", "wait_to_reuse_claims", "max_claims", "budget_weight")
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    BATCH_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_IDLE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_PENDING_PODS_FIELD_NUMBER: _ClassVar[int]
    MAX_PENDING_PODS_PER_PROFILE_FIELD_NUMBER: _ClassVar[int]
    MAX_EXECUTORS_FIELD_NUMBER: _ClassVar[int]
    DELETE_ON_TERMINATION_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_CONTAINER_NAME_FIELD_NUMBER: _ClassVar[int]
    CHECK_ALL_CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    STUCK_PENDING_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    MIN_EXECUTORS_AT_ONCE_FIELD_NUMBER: _ClassVar[int]
    DRIVER_OWNS_CLAIMS_FIELD_NUMBER: _ClassVar[int]
    REUSE_CLAIMS_FIELD_NUMBER: _ClassVar[int]
    WAIT_TO_REUSE_CLAIMS_FIELD_NUMBER: _ClassVar[int]
    MAX_CLAIMS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    batch_size: int
    batch_delay_ms: int
    executor_timeout_ms: int
    executor_idle_timeout_ms: int
    max_pending_pods: int
    max_pending_pods_per_profile: int
    max_executors: int
    delete_on_termination: bool
    executor_container_name: str
    check_all_containers: bool
    policy: AllocationPolicy
    stuck_pending_timeout_ms: int
    min_executors_at_once: int
    driver_owns_claims: bool
    reuse_claims: bool
    wait_to_reuse_claims: bool
    max_claims: int
    budget_weight: int
    def __init__(self, batch_size: _Optional[int] = ..., batch_delay_ms: _Optional[int] = ..., executor_timeout_ms: _Optional[int] = ..., executor_idle_timeout_ms: _Optional[int] = ..., max_pending_pods: _Optional[int] = ..., max_pending_pods_per_profile: _Optional[int] = ..., max_executors: _Optional[int] = ..., delete_on_termination: _Optional[bool] = ..., executor_container_name: _Optional[str] = ..., check_all_containers: _Optional[bool] = ..., policy: _Optional[_Union[AllocationPolicy, str]] = ..., stuck_pending_timeout_ms: _Optional[int] = ..., min_executors_at_once: _Optional[int] = ..., driver_owns_claims: _Optional[bool] = ..., reuse_claims: _Optional[bool] = ..., wait_to_reuse_claims: _Optional[bool] = ..., max_claims: _Optional[int] = ..., budget_weight: _Optional[int] = ...) -> None: ...

class StartRequest(_message.Message):
    __slots__ = ("application_id", "namespace", "driver_pod_name", "executor_pod_template", "pod_name_prefix", "settings", "resource_profile_templates", "executor_claim_templates")
    class ResourceProfileTemplatesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: str
        def __init__(self, key: _Optional[int] = ..., value: _Optional[str] = ...) -> None: ...
    APPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    DRIVER_POD_NAME_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_POD_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    POD_NAME_PREFIX_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_PROFILE_TEMPLATES_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_CLAIM_TEMPLATES_FIELD_NUMBER: _ClassVar[int]
    application_id: str
    namespace: str
    driver_pod_name: str
    executor_pod_template: str
    pod_name_prefix: str
    settings: AllocationSettings
    resource_profile_templates: _containers.ScalarMap[int, str]
    executor_claim_templates: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, application_id: _Optional[str] = ..., namespace: _Optional[str] = ..., driver_pod_name: _Optional[str] = ..., executor_pod_template: _Optional[str] = ..., pod_name_prefix: _Optional[str] = ..., settings: _Optional[_Union[AllocationSettings, _Mapping]] = ..., resource_profile_templates: _Optional[_Mapping[int, str]] = ..., executor_claim_templates: _Optional[_Iterable[str]] = ...) -> None: ...

class StartResponse(_message.Message):
    __slots__ = ("resumed", "last_executor_id")
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    LAST_EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    resumed: bool
    last_executor_id: int
    def __init__(self, resumed: _Optional[bool] = ..., last_executor_id: _Optional[int] = ...) -> None: ...

class SetTotalExpectedRequest(_message.Message):
    __slots__ = ("application_id", "executors_per_profile", "resource_profile_templates")
    class ExecutorsPerProfileEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    class ResourceProfileTemplatesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: str
        def __init__(self, key: _Optional[int] = ..., value: _Optional[str] = ...) -> None: ...
    APPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    EXECUTORS_PER_PROFILE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_PROFILE_TEMPLATES_FIELD_NUMBER: _ClassVar[int]
    application_id: str
    executors_per_profile: _containers.ScalarMap[int, int]
    resource_profile_templates: _containers.ScalarMap[int, str]
    def __init__(self, application_id: _Optional[str] = ..., executors_per_profile: _Optional[_Mapping[int, int]] = ..., resource_profile_templates: _Optional[_Mapping[int, str]] = ...) -> None: ...

class SetTotalExpectedResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class IsDeletedRequest(_message.Message):
    __slots__ = ("application_id", "executor_id")
    APPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    application_id: str
    executor_id: str
    def __init__(self, application_id: _Optional[str] = ..., executor_id: _Optional[str] = ...) -> None: ...

class IsDeletedResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class UpdateRegisteredExecutorsRequest(_message.Message):
    __slots__ = ("application_id", "executor_ids", "running_tasks")
    class RunningTasksEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    APPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_IDS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_TASKS_FIELD_NUMBER: _ClassVar[int]
    application_id: str
    executor_ids: _containers.RepeatedScalarFieldContainer[str]
    running_tasks: _containers.ScalarMap[str, int]
    def __init__(self, application_id: _Optional[str] = ..., executor_ids: _Optional[_Iterable[str]] = ..., running_tasks: _Optional[_Mapping[str, int]] = ...) -> None: ...

class UpdateRegisteredExecutorsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StopRequest(_message.Message):
    __slots__ = ("application_id",)
    APPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    application_id: str
    def __init__(self, application_id: _Optional[str] = ...) -> None: ...

class StopResponse(_message.Message):
    __slots__ = ("deleted_pods",)
    DELETED_PODS_FIELD_NUMBER: _ClassVar[int]
    deleted_pods: int
    def __init__(self, deleted_pods: _Optional[int] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ("application_id",)
    APPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    application_id: str
    def __init__(self, application_id: _Optional[str] = ...) -> None: ...

class ProfileStatus(_message.Message):
    __slots__ = ("resource_profile_id", "target", "running", "pending", "newly_created", "last_create_failure", "backoff_until_ms", "held", "held_by", "borrowed", "reclaiming")
    RESOURCE_PROFILE_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    NEWLY_CREATED_FIELD_NUMBER: _ClassVar[int]
    LAST_CREATE_FAILURE_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    HELD_BY_FIELD_NUMBER: _ClassVar[int]
    BORROWED_FIELD_NUMBER: _ClassVar[int]
    RECLAIMING_FIELD_NUMBER: _ClassVar[int]
    resource_profile_id: int
    target: int
    running: int
    pending: int
    newly_created: int
    last_create_failure: CreateFailure
    backoff_until_ms: int
    held: int
    held_by: BudgetHold
    borrowed: int
    reclaiming: int
    def __init__(self, resource_profile_id: _Optional[int] = ..., target: _Optional[int] = ..., running: _Optional[int] = ..., pending: _Optional[int] = ..., newly_created: _Optional[int] = ..., last_create_failure: _Optional[_Union[CreateFailure, _Mapping]] = ..., backoff_until_ms: _Optional[int] = ..., held: _Optional[int] = ..., held_by: _Optional[_Union[BudgetHold, _Mapping]] = ..., borrowed: _Optional[int] = ..., reclaiming: _Optional[int] = ...) -> None: ...

class BudgetHold(_message.Message):
    __slots__ = ("budget", "resource", "used", "limit", "share")
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    budget: str
    resource: str
    used: int
    limit: int
    share: int
    def __init__(self, budget: _Optional[str] = ..., resource: _Optional[str] = ..., used: _Optional[int] = ..., limit: _Optional[int] = ..., share: _Optional[int] = ...) -> None: ...

class CreateFailure(_message.Message):
    __slots__ = ("http_code", "code", "reason", "message", "time_ms", "consecutive_failures", "total_failures")
    HTTP_CODE_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TIME_MS_FIELD_NUMBER: _ClassVar[int]
    CONSECUTIVE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FAILURES_FIELD_NUMBER: _ClassVar[int]
    http_code: int
    code: str
    reason: str
    message: str
    time_ms: int
    consecutive_failures: int
    total_failures: int
    def __init__(self, http_code: _Optional[int] = ..., code: _Optional[str] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., time_ms: _Optional[int] = ..., consecutive_failures: _Optional[int] = ..., total_failures: _Optional[int] = ...) -> None: ...

class ExecutorFailure(_message.Message):
    __slots__ = ("executor_id", "resource_profile_id", "pod_name", "state", "exit_code", "reason", "message", "time_ms")
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_PROFILE_ID_FIELD_NUMBER: _ClassVar[int]
    POD_NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TIME_MS_FIELD_NUMBER: _ClassVar[int]
    executor_id: int
    resource_profile_id: int
    pod_name: str
    state: str
    exit_code: int
    reason: str
    message: str
    time_ms: int
    def __init__(self, executor_id: _Optional[int] = ..., resource_profile_id: _Optional[int] = ..., pod_name: _Optional[str] = ..., state: _Optional[str] = ..., exit_code: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., time_ms: _Optional[int] = ...) -> None: ...

class ApplicationStatus(_message.Message):
    __slots__ = ("profiles", "deleted_executor_ids", "last_executor_id", "outstanding", "driver", "failed_executors")
    PROFILES_FIELD_NUMBER: _ClassVar[int]
    DELETED_EXECUTOR_IDS_FIELD_NUMBER: _ClassVar[int]
    LAST_EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    OUTSTANDING_FIELD_NUMBER: _ClassVar[int]
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    FAILED_EXECUTORS_FIELD_NUMBER: _ClassVar[int]
    profiles: _containers.RepeatedCompositeFieldContainer[ProfileStatus]
    deleted_executor_ids: _containers.RepeatedScalarFieldContainer[int]
    last_executor_id: int
    outstanding: bool
    driver: DriverStatus
    failed_executors: _containers.RepeatedCompositeFieldContainer[ExecutorFailure]
    def __init__(self, profiles: _Optional[_Iterable[_Union[ProfileStatus, _Mapping]]] = ..., deleted_executor_ids: _Optional[_Iterable[int]] = ..., last_executor_id: _Optional[int] = ..., outstanding: _Optional[bool] = ..., driver: _Optional[_Union[DriverStatus, _Mapping]] = ..., failed_executors: _Optional[_Iterable[_Union[ExecutorFailure, _Mapping]]] = ...) -> None: ...

class DriverStatus(_message.Message):
    __slots__ = ("pod_name", "phase", "followed", "ended_at_ms", "forget_at_ms")
    POD_NAME_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    FOLLOWED_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    FORGET_AT_MS_FIELD_NUMBER: _ClassVar[int]
    pod_name: str
    phase: str
    followed: bool
    ended_at_ms: int
    forget_at_ms: int
    def __init__(self, pod_name: _Optional[str] = ..., phase: _Optional[str] = ..., followed: _Optional[bool] = ..., ended_at_ms: _Optional[int] = ..., forget_at_ms: _Optional[int] = ...) -> None: ...

class WatchExecutorsRequest(_message.Message):
    __slots__ = ("application_id", "since")
    APPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    application_id: str
    since: int
    def __init__(self, application_id: _Optional[str] = ..., since: _Optional[int] = ...) -> None: ...

class ExecutorPod(_message.Message):
    __slots__ = ("executor_id", "resource_profile_id", "pod_name", "phase", "state", "exit_code", "reason", "message", "pod_json")
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_PROFILE_ID_FIELD_NUMBER: _ClassVar[int]
    POD_NAME_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    POD_JSON_FIELD_NUMBER: _ClassVar[int]
    executor_id: int
    resource_profile_id: int
    pod_name: str
    phase: str
    state: ExecutorPodState
    exit_code: int
    reason: str
    message: str
    pod_json: str
    def __init__(self, executor_id: _Optional[int] = ..., resource_profile_id: _Optional[int] = ..., pod_name: _Optional[str] = ..., phase: _Optional[str] = ..., state: _Optional[_Union[ExecutorPodState, str]] = ..., exit_code: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., pod_json: _Optional[str] = ...) -> None: ...

class ExecutorEvent(_message.Message):
    __slots__ = ("sequence", "kind", "executor", "reclaim")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_FIELD_NUMBER: _ClassVar[int]
    RECLAIM_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    kind: ExecutorEventKind
    executor: ExecutorPod
    reclaim: ExecutorReclaim
    def __init__(self, sequence: _Optional[int] = ..., kind: _Optional[_Union[ExecutorEventKind, str]] = ..., executor: _Optional[_Union[ExecutorPod, _Mapping]] = ..., reclaim: _Optional[_Union[ExecutorReclaim, _Mapping]] = ...) -> None: ...

class ExecutorReclaim(_message.Message):
    __slots__ = ("deadline_ms", "budget")
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    deadline_ms: int
    budget: str
    def __init__(self, deadline_ms: _Optional[int] = ..., budget: _Optional[str] = ...) -> None: ...
