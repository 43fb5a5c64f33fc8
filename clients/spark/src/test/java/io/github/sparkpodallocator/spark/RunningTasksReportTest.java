package io.github.sparkpodallocator.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;

import io.grpc.Server;
import io.grpc.netty.shaded.io.grpc.netty.NettyServerBuilder;
import io.grpc.stub.StreamObserver;
import java.net.InetSocketAddress;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CopyOnWriteArrayList;
import org.apache.spark.SparkConf;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import spark.allocator.v1.Allocator.StartRequest;
import spark.allocator.v1.Allocator.StartResponse;
import spark.allocator.v1.Allocator.UpdateRegisteredExecutorsRequest;
import spark.allocator.v1.Allocator.UpdateRegisteredExecutorsResponse;
import spark.allocator.v1.ExecutorAllocatorGrpc;

/**
 * The registered executors and the tasks running on each, as the client sends them, against a
 * service that records every UpdateRegisteredExecutors.
 */
class RunningTasksReportTest {
  private final List<UpdateRegisteredExecutorsRequest> received = new CopyOnWriteArrayList<>();
  private Server server;
  private AllocatorClient client;

  @BeforeEach
  void startService() throws Exception {
    server = NettyServerBuilder.forAddress(new InetSocketAddress("127.0.0.1", 0))
        .addService(new ExecutorAllocatorGrpc.ExecutorAllocatorImplBase() {
          @Override
          public void start(StartRequest request, StreamObserver<StartResponse> answer) {
            answer.onNext(StartResponse.getDefaultInstance());
            answer.onCompleted();
          }

          @Override
          public void updateRegisteredExecutors(UpdateRegisteredExecutorsRequest request,
              StreamObserver<UpdateRegisteredExecutorsResponse> answer) {
            received.add(request);
            answer.onNext(UpdateRegisteredExecutorsResponse.getDefaultInstance());
            answer.onCompleted();
          }
        })
        .build()
        .start();
    SparkConf conf = new SparkConf(false)
        .set(ServiceSettings.ADDRESS, "127.0.0.1:" + server.getPort())
        .set(ServiceSettings.TOKEN_FILE, "");
    client = new AllocatorClient(ServiceSettings.fromConf(conf, Path.of("/nonexistent")));
    client.start(StartRequest.newBuilder().setApplicationId("app").build());
  }

  @AfterEach
  void stopService() throws Exception {
    client.close();
    server.shutdownNow().awaitTermination();
  }

  @Test
  void runningTasksGoWithTheRegisteredExecutorsAndAloneAtMostOncePerInterval() {
    Duration never = Duration.ofDays(1);
    client.updateRegisteredExecutors(List.of("1", "2"), Map.of("1", 2, "2", 0), never);
    assertEquals(1, received.size());
    assertEquals(List.of("1", "2"), received.get(0).getExecutorIdsList());
    assertEquals(Map.of("1", 2, "2", 0), received.get(0).getRunningTasksMap());

    // Nothing changed: nothing sent.
    client.updateRegisteredExecutors(List.of("1", "2"), Map.of("1", 2, "2", 0), Duration.ZERO);
    // Only the running tasks changed, within the interval: not sent yet.
    client.updateRegisteredExecutors(List.of("1", "2"), Map.of("1", 1, "2", 1), never);
    assertEquals(1, received.size());

    // A new executor is sent at once, with the tasks as they are now.
    client.updateRegisteredExecutors(List.of("1", "2", "3"), Map.of("1", 1, "2", 1, "3", 0),
        never);
    assertEquals(2, received.size());
    assertEquals(Map.of("1", 1, "2", 1, "3", 0), received.get(1).getRunningTasksMap());

    // The interval past (none here): running tasks that alone changed are sent.
    client.updateRegisteredExecutors(List.of("1", "2", "3"), Map.of("1", 0, "2", 1, "3", 1),
        Duration.ZERO);
    assertEquals(3, received.size());
    assertEquals(List.of("1", "2", "3"), received.get(2).getExecutorIdsList());
    assertEquals(Map.of("1", 0, "2", 1, "3", 1), received.get(2).getRunningTasksMap());
  }

  @Test
  void theCountsAreSparksForTheRegisteredExecutorsOnly() {
    // Spark's map may hold an executor being removed; a registered one without tasks has none.
    Map<String, Object> spark = Map.of("1", 3, "7", 1);
    assertEquals(Map.of("1", 3, "2", 0),
        ServicePodsAllocator.runningTasks(List.of("1", "2"), spark));
  }
}
