"""The client's bearer token against a service with `auth.mode = kubernetes`, whose
simulated cluster answers TokenReview and SubjectAccessReview."""

from __future__ import annotations

import pathlib

import grpc
import pytest

from spark_pod_allocator import AllocatorClient, PermissionDenied, Unauthenticated

from conftest import TEMPLATE, running_service

DRIVER = "system:serviceaccount:spark:driver"
OTHER = "system:serviceaccount:spark:other"

CONFIG = f"""
[auth]
mode = "kubernetes"
audiences = ["spark-pod-allocator"]

[simulator]
namespaces = ["default", "spark", "elsewhere"]

[[simulator.access.tokens]]
token = "driver-token"
username = "{DRIVER}"
groups = ["system:serviceaccounts"]
audiences = ["spark-pod-allocator"]

[[simulator.access.tokens]]
token = "other-token"
username = "{OTHER}"
audiences = ["spark-pod-allocator"]

[[simulator.access.grants]]
users = ["{DRIVER}", "{OTHER}"]
namespaces = ["spark"]
verbs = ["create", "delete", "list"]
resources = ["pods"]
"""


@pytest.fixture(scope="module")
def authenticated_service(tmp_path_factory):
    config = tmp_path_factory.mktemp("auth") / "config.toml"
    config.write_text(CONFIG)
    with running_service(config=config) as target:
        yield target


def test_a_token_authenticates_and_authorizes_the_caller(authenticated_service, tmp_path: pathlib.Path):
    with AllocatorClient(authenticated_service) as anonymous:
        with pytest.raises(Unauthenticated) as err:
            anonymous.start("py-auth", "spark", executor_pod_template=TEMPLATE)
        assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
        assert "authorization: Bearer" in err.value.details
    with AllocatorClient(authenticated_service, token="forged") as forged:
        with pytest.raises(Unauthenticated):
            forged.start("py-auth", "spark", executor_pod_template=TEMPLATE)

    # The projected token as a driver pod reads it, from a file.
    token_file = tmp_path / "token"
    token_file.write_text("driver-token\n")
    with AllocatorClient(authenticated_service, token_file=token_file) as driver:
        with pytest.raises(PermissionDenied) as err:
            driver.start("py-auth", "elsewhere", executor_pod_template=TEMPLATE)
        assert f"{DRIVER} may not create pods in namespace elsewhere" in err.value.details
        started = driver.start("py-auth", "spark", executor_pod_template=TEMPLATE)
        assert started.resumed is False
        driver.set_total_expected("py-auth", {0: 1})

        with AllocatorClient(authenticated_service, token="other-token") as other:
            with pytest.raises(PermissionDenied) as err:
                other.start("py-auth", "spark", executor_pod_template=TEMPLATE)
            assert "another identity" in err.value.details
            with pytest.raises(PermissionDenied):
                other.stop("py-auth")

        assert driver.get_status("py-auth").profiles[0].target == 1
        assert driver.stop("py-auth") >= 0
