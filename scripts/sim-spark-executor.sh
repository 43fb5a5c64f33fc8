#!/usr/bin/env bash
# Spark executor entrypoint for the simulator's process runtime
# (`simulator.kubelet.runtime = "process"`, see docs/simulator.md): what Spark's image runs
# for `executor`, with a local classpath instead of the image's /opt/spark/jars.
#
# Environment (Spark sets these on its executor container; the simulator resolves the
# downward-API ones, SPARK_EXECUTOR_POD_IP being 127.0.0.1):
#   SPARK_SIM_CLASSPATH   required unless SPARK_HOME is set: the executor's classpath
#                         (Spark's jars and the application's), e.g. "/spark/jars/*:/app.jar";
#                         give it in the process_images entry's `env`
#   SPARK_HOME            optional: "$SPARK_HOME/jars/*" when SPARK_SIM_CLASSPATH is unset
#   JAVA_HOME             optional: its bin/java, else `java` on PATH
#   SPARK_CONF_DIR, SPARK_CLASSPATH   optional: put first on the classpath, as Spark's image does
#   SPARK_JAVA_OPT_0..N   JVM options, passed in numeric order
#   SPARK_SIM_HOST_PER_EXECUTOR   optional, "true": the executor binds and advertises a
#                         loopback address of its own, 127.0.X.Y from its id (2 <= Y <= 251),
#                         instead of the pod IP, as pods on a cluster each have their own
#                         (Spark tells executors apart by host, e.g. whether the shuffle
#                         output a decommissioned executor migrated outlives it); Linux routes
#                         all of 127.0.0.0/8 to the loopback interface
#   SPARK_EXECUTOR_MEMORY, SPARK_DRIVER_URL, SPARK_EXECUTOR_ID, SPARK_EXECUTOR_CORES,
#   SPARK_APPLICATION_ID, SPARK_EXECUTOR_POD_IP, SPARK_RESOURCE_PROFILE_ID,
#   SPARK_EXECUTOR_POD_NAME   required, from Spark's executor pod
# The container's args (`executor`) only select this mode in Spark's image: ignored here.
set -euo pipefail

for name in SPARK_EXECUTOR_MEMORY SPARK_DRIVER_URL SPARK_EXECUTOR_ID SPARK_EXECUTOR_CORES \
  SPARK_APPLICATION_ID SPARK_EXECUTOR_POD_IP SPARK_RESOURCE_PROFILE_ID SPARK_EXECUTOR_POD_NAME; do
  if [ -z "${!name:-}" ]; then
    echo "sim-spark-executor: $name is not set (is this a Spark executor pod?)" >&2
    exit 64
  fi
done

classpath="${SPARK_SIM_CLASSPATH:-}"
if [ -z "$classpath" ]; then
  if [ -z "${SPARK_HOME:-}" ]; then
    echo "sim-spark-executor: set SPARK_SIM_CLASSPATH (or SPARK_HOME) in the process_images entry's env" >&2
    exit 64
  fi
  classpath="$SPARK_HOME/jars/*"
fi
if [ -n "${SPARK_CLASSPATH:-}" ]; then
  classpath="$SPARK_CLASSPATH:$classpath"
fi
if [ -n "${SPARK_CONF_DIR:-}" ]; then
  classpath="$SPARK_CONF_DIR:$classpath"
fi

# SPARK_JAVA_OPT_<n> in numeric order (not the order of `env`).
java_opts=()
while IFS= read -r opt; do
  java_opts+=("${!opt}")
done < <(compgen -e | grep -E '^SPARK_JAVA_OPT_[0-9]+$' | sort -t_ -k4 -n)

java="java"
if [ -n "${JAVA_HOME:-}" ]; then
  java="$JAVA_HOME/bin/java"
fi

host="$SPARK_EXECUTOR_POD_IP"
if [ "${SPARK_SIM_HOST_PER_EXECUTOR:-}" = "true" ]; then
  if ! [[ "$SPARK_EXECUTOR_ID" =~ ^[0-9]+$ ]]; then
    echo "sim-spark-executor: SPARK_EXECUTOR_ID=$SPARK_EXECUTOR_ID is not a number" >&2
    exit 64
  fi
  host="127.0.$(( (SPARK_EXECUTOR_ID / 250) % 256 )).$(( SPARK_EXECUTOR_ID % 250 + 2 ))"
fi

# exec: the JVM is the container's process, so SIGTERM from a pod deletion reaches it.
exec "$java" "${java_opts[@]}" \
  -Xms"$SPARK_EXECUTOR_MEMORY" -Xmx"$SPARK_EXECUTOR_MEMORY" \
  -cp "$classpath" \
  org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
  --driver-url "$SPARK_DRIVER_URL" \
  --executor-id "$SPARK_EXECUTOR_ID" \
  --cores "$SPARK_EXECUTOR_CORES" \
  --app-id "$SPARK_APPLICATION_ID" \
  --hostname "$host" \
  --resourceProfileId "$SPARK_RESOURCE_PROFILE_ID" \
  --podName "$SPARK_EXECUTOR_POD_NAME"
