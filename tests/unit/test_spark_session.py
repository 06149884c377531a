"""The driver JVM's environment: the local JIT option is added only where the operator has said
nothing about the JVM and the master known before it starts is local."""

from __future__ import annotations

import pytest

from bucketspark.session import LOCAL_JVM_OPTIONS, jvm_environ


@pytest.mark.parametrize(
    ("environ", "master"),
    [({}, None), ({}, "local[2]"), ({"MASTER": "local[*]"}, None), ({"PATH": "/bin"}, "local")],
)
def test_a_local_driver_jvm_gets_the_local_jit_option(environ, master):
    assert jvm_environ(environ, master) == {**environ, "JDK_JAVA_OPTIONS": LOCAL_JVM_OPTIONS}


@pytest.mark.parametrize(
    ("environ", "master"),
    [
        ({}, "spark://head:7077"),
        ({"MASTER": "yarn"}, None),
        ({"JDK_JAVA_OPTIONS": "-Xmx2g"}, None),
        ({"PYSPARK_SUBMIT_ARGS": "--driver-memory 2g pyspark-shell"}, "local[2]"),
    ],
    ids=["cluster master", "cluster MASTER", "operator's JVM options", "operator's submit args"],
)
def test_the_operators_settings_and_a_cluster_master_leave_the_environment_alone(environ, master):
    assert jvm_environ(environ, master) == environ
