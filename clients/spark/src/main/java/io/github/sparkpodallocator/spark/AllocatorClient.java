package io.github.sparkpodallocator.spark;

import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ChannelCredentials;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ClientInterceptors;
import io.grpc.Context;
import io.grpc.ForwardingClientCall;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.TlsChannelCredentials;
import io.grpc.netty.shaded.io.grpc.netty.NettyChannelBuilder;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.NavigableMap;
import java.util.Optional;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import spark.allocator.v1.Allocator.ApplicationStatus;
import spark.allocator.v1.Allocator.ExecutorEvent;
import spark.allocator.v1.Allocator.GetStatusRequest;
import spark.allocator.v1.Allocator.IsDeletedRequest;
import spark.allocator.v1.Allocator.SetTotalExpectedRequest;
import spark.allocator.v1.Allocator.StartRequest;
import spark.allocator.v1.Allocator.StartResponse;
import spark.allocator.v1.Allocator.StopRequest;
import spark.allocator.v1.Allocator.UpdateRegisteredExecutorsRequest;
import spark.allocator.v1.Allocator.WatchExecutorsRequest;
import spark.allocator.v1.ExecutorAllocatorGrpc;
import spark.allocator.v1.ExecutorAllocatorGrpc.ExecutorAllocatorBlockingStub;

/**
 * One application's connection to the allocation service, and the one record of what the
 * application told it: the Start request, every profile's template, the last targets and the
 * registered executors.
 *
 * <p>A restarted service resumes the application from the registration it keeps (Start, the
 * templates, the targets, the registered executors), so the client sends nothing again after a
 * restart. Only a service that lost the application (its registration was refused or never
 * written) answers NOT_FOUND: then the record is the only copy left, and a new Start with every
 * template (which resumes the executors found in the cluster), the last targets and registered
 * executors give it all back before the failed call is retried. An UNAVAILABLE service is
 * retried with exponential backoff for at most {@link ServiceSettings#retryTimeout()}.
 */
public final class AllocatorClient implements AutoCloseable {
  private static final Logger LOG = LoggerFactory.getLogger(AllocatorClient.class);
  private static final Duration FIRST_BACKOFF = Duration.ofMillis(100);
  private static final Duration MAX_BACKOFF = Duration.ofSeconds(5);
  /** Spark's default resource profile, whose template is Start's executor pod template. */
  private static final int DEFAULT_PROFILE = 0;
  private static final Metadata.Key<String> AUTHORIZATION =
      Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER);

  private final ManagedChannel channel;
  private final ExecutorAllocatorBlockingStub stub;
  private final ServiceSettings settings;

  // What the service was sent, for a service that lost the application. Guarded by `this`.
  private StartRequest start;
  /** Each profile's template, by profile id; profile 0's is Start's executor pod template. */
  private final NavigableMap<Integer, String> templates = new TreeMap<>();
  private final Map<Integer, Integer> targets = new TreeMap<>();
  private List<String> registered;
  /** The running tasks last sent with {@link #registered}, and when (System.nanoTime). */
  private Map<String, Integer> runningTasks = Map.of();
  private long runningTasksSentAt;
  /** Set by {@link #endAllocation}: every target stays 0. */
  private boolean allocationEnded;

  /** Serialises SetTotalExpected so targets reach the service in the order Spark set them. */
  private final Object targetsOrder = new Object();

  /** A client on a new channel to {@link ServiceSettings#address()}. */
  public AllocatorClient(ServiceSettings settings) throws IOException {
    this(channel(settings), settings);
  }

  AllocatorClient(ManagedChannel channel, ServiceSettings settings) {
    this.channel = channel;
    this.settings = settings;
    Channel intercepted = settings.tokenFile().isPresent()
        ? ClientInterceptors.intercept(channel, new BearerToken(settings.tokenFile().get()))
        : channel;
    this.stub = ExecutorAllocatorGrpc.newBlockingStub(intercepted);
    if (settings.tokenFile().isPresent() && !settings.tls()) {
      LOG.warn("Sending the bearer token of {} to {} without TLS; set {}=true",
          settings.tokenFile().get(), settings.address(), ServiceSettings.TLS_ENABLED);
    }
  }

  private static ManagedChannel channel(ServiceSettings settings) throws IOException {
    ChannelCredentials credentials;
    if (settings.tls()) {
      TlsChannelCredentials.Builder tls = TlsChannelCredentials.newBuilder();
      if (settings.caFile().isPresent()) {
        tls.trustManager(settings.caFile().get().toFile());
      }
      if (settings.certFile().isPresent() && settings.keyFile().isPresent()) {
        tls.keyManager(settings.certFile().get().toFile(), settings.keyFile().get().toFile());
      }
      credentials = tls.build();
    } else {
      credentials = InsecureChannelCredentials.create();
    }
    // The Netty builder directly: no provider lookup through the (relocated) registry.
    return NettyChannelBuilder.forTarget(settings.address(), credentials).build();
  }

  /** The application's Start; remembered for a service that loses the application. */
  public StartResponse start(StartRequest request) {
    synchronized (this) {
      start = request;
      templates.clear();
      templates.put(DEFAULT_PROFILE, request.getExecutorPodTemplate());
      templates.putAll(request.getResourceProfileTemplatesMap());
    }
    StartResponse response = call("Start", s -> s.start(request), false, settings.retryTimeout());
    LOG.info("spark-pod-allocator started application {} (resumed: {}, last executor id: {})",
        request.getApplicationId(), response.getResumed(), response.getLastExecutorId());
    return response;
  }

  /** Whether the service was sent this profile's template (with Start or SetTotalExpected). */
  public synchronized boolean hasTemplate(int profile) {
    return templates.containsKey(profile);
  }

  /**
   * Sets the executors wanted per profile; {@code newTemplates} are the templates of profiles
   * the service has not been sent yet (see {@link #hasTemplate}).
   */
  public void setTotalExpected(Map<Integer, Integer> perProfile, Map<Integer, String> newTemplates) {
    synchronized (targetsOrder) {
      synchronized (this) {
        if (allocationEnded) {
          LOG.debug("Not sending targets {}: the application's allocation has ended", perProfile);
          return;
        }
      }
      SetTotalExpectedRequest.Builder request = SetTotalExpectedRequest.newBuilder()
          .setApplicationId(applicationId())
          .putAllResourceProfileTemplates(newTemplates);
      perProfile.forEach((profile, total) -> request.putExecutorsPerProfile(profile, total));
      SetTotalExpectedRequest built = request.build();
      call("SetTotalExpected", s -> s.setTotalExpected(built), true, settings.retryTimeout());
      synchronized (this) {
        templates.putAll(newTemplates);
        targets.putAll(perProfile);
      }
    }
  }

  /**
   * Sends the last targets the service answered again, and has the next
   * {@link #updateRegisteredExecutors} send the registered executors even if unchanged. The
   * service answers before its registration holds what a call said, so a replica that took
   * the application over (its owner lost or cut off in between) or a restarted service may
   * resume it with older targets, and Spark sends targets only when they change. Changes
   * nothing otherwise.
   */
  public void sendTargetsAgain() {
    synchronized (targetsOrder) {
      SetTotalExpectedRequest request;
      synchronized (this) {
        registered = null;
        if (start == null || targets.isEmpty()) {
          return;
        }
        request = SetTotalExpectedRequest.newBuilder()
            .setApplicationId(applicationId())
            .putAllExecutorsPerProfile(targets)
            .build();
      }
      call("SetTotalExpected", s -> s.setTotalExpected(request), true, settings.retryTimeout());
    }
  }

  /**
   * Sets every profile's target to 0 and keeps it there: later {@link #setTotalExpected} calls
   * are dropped, and a service that lost the application gets the zeros. For a driver that is
   * stopping. Tried for one {@link ServiceSettings#deadline()} only, not the retry timeout:
   * Spark's stop must not wait on a service that is away, and Stop follows anyway.
   */
  public void endAllocation() {
    synchronized (targetsOrder) {
      SetTotalExpectedRequest request;
      synchronized (this) {
        allocationEnded = true;
        Set<Integer> profiles = new TreeSet<>(targets.keySet());
        profiles.addAll(templates.keySet());
        profiles.forEach(profile -> targets.put(profile, 0));
        request = SetTotalExpectedRequest.newBuilder()
            .setApplicationId(applicationId())
            .putAllExecutorsPerProfile(targets)
            .build();
      }
      call("SetTotalExpected", s -> s.setTotalExpected(request), true, settings.deadline());
    }
  }

  /**
   * Whether the service deleted this executor; {@link ServiceSettings#isDeletedWhenUnavailable()}
   * when the service stays unreachable for one deadline (the answer is on the path of the
   * executor's registration, which must not hang).
   */
  public boolean isDeleted(String executorId) {
    IsDeletedRequest request = IsDeletedRequest.newBuilder()
        .setApplicationId(applicationId())
        .setExecutorId(executorId)
        .build();
    try {
      return call("IsDeleted", s -> s.isDeleted(request), true, settings.deadline()).getDeleted();
    } catch (AllocatorServiceException e) {
      Status.Code code = e.code();
      if (code == Status.Code.UNAVAILABLE || code == Status.Code.DEADLINE_EXCEEDED) {
        LOG.warn("IsDeleted({}) could not reach the spark-pod-allocator service ({}); answering"
            + " {} ({})", executorId, e.getMessage(), settings.isDeletedWhenUnavailable(),
            ServiceSettings.IS_DELETED_WHEN_UNAVAILABLE);
        return settings.isDeletedWhenUnavailable();
      }
      throw e;
    }
  }

  /**
   * Replaces the set of executors registered with the driver, with the tasks running on each
   * (by executor id). A new set is sent at once; when only the running tasks changed they are
   * sent no more often than once per {@code runningTasksEvery} (they only order the service's
   * choice of executors to ask back, and change with every task); nothing is sent when
   * neither changed.
   */
  public void updateRegisteredExecutors(List<String> executorIds,
      Map<String, Integer> runningTasks, Duration runningTasksEvery) {
    long now = System.nanoTime();
    synchronized (this) {
      if (executorIds.equals(registered) && (runningTasks.equals(this.runningTasks)
          || now - runningTasksSentAt < runningTasksEvery.toNanos())) {
        return;
      }
    }
    UpdateRegisteredExecutorsRequest request = UpdateRegisteredExecutorsRequest.newBuilder()
        .setApplicationId(applicationId())
        .addAllExecutorIds(executorIds)
        .putAllRunningTasks(runningTasks)
        .build();
    call("UpdateRegisteredExecutors", s -> s.updateRegisteredExecutors(request), true,
        settings.retryTimeout());
    synchronized (this) {
      registered = List.copyOf(executorIds);
      this.runningTasks = Map.copyOf(runningTasks);
      runningTasksSentAt = now;
    }
  }

  /** Replaces the set of executors registered with the driver, without running tasks. */
  public void updateRegisteredExecutors(List<String> executorIds) {
    updateRegisteredExecutors(executorIds, Map.of(), Duration.ZERO);
  }

  /** Deletes the application's executor pods; the number the service deleted. */
  public int stop() {
    StopRequest request = StopRequest.newBuilder().setApplicationId(applicationId()).build();
    return call("Stop", s -> s.stop(request), true, settings.retryTimeout()).getDeletedPods();
  }

  /** The service's view of the application. */
  public ApplicationStatus status() {
    GetStatusRequest request =
        GetStatusRequest.newBuilder().setApplicationId(applicationId()).build();
    return call("GetStatus", s -> s.getStatus(request), true, settings.retryTimeout());
  }

  /**
   * Opens the application's executor event stream after {@code since} (0: the full state
   * first). It has no deadline: it lasts as long as the application; cancelling {@code context}
   * ends it. Errors surface from the iterator as {@link StatusRuntimeException}.
   */
  public Iterator<ExecutorEvent> watchExecutors(long since, Context.CancellableContext context) {
    WatchExecutorsRequest request = WatchExecutorsRequest.newBuilder()
        .setApplicationId(applicationId())
        .setSince(since)
        .build();
    // The call belongs to the context current when it is made.
    Context previous = context.attach();
    try {
      return stub.watchExecutors(request);
    } finally {
      context.detach(previous);
    }
  }

  @Override
  public void close() {
    channel.shutdown();
    try {
      if (!channel.awaitTermination(5, TimeUnit.SECONDS)) {
        channel.shutdownNow();
      }
    } catch (InterruptedException e) {
      channel.shutdownNow();
      Thread.currentThread().interrupt();
    }
  }

  private synchronized String applicationId() {
    if (start == null) {
      throw new IllegalStateException("the application was not started (no Start call yet)");
    }
    return start.getApplicationId();
  }

  /**
   * Runs {@code rpc}: UNAVAILABLE is retried with backoff within {@code retryFor}; NOT_FOUND
   * (the service lost the application) is answered once by {@link #startAgain}.
   */
  private <T> T call(String name, Function<ExecutorAllocatorBlockingStub, T> rpc,
      boolean startAgainOnNotFound, Duration retryFor) {
    long giveUpAt = System.nanoTime() + retryFor.toNanos();
    Duration backoff = FIRST_BACKOFF;
    boolean startedAgain = false;
    while (true) {
      try {
        return rpc.apply(
            stub.withDeadlineAfter(settings.deadline().toMillis(), TimeUnit.MILLISECONDS));
      } catch (StatusRuntimeException e) {
        Status.Code code = e.getStatus().getCode();
        // A closed client (the plugin stopped) is not coming back: no retry.
        if (code == Status.Code.UNAVAILABLE && !channel.isShutdown()
            && System.nanoTime() + backoff.toNanos() < giveUpAt) {
          LOG.warn("spark-pod-allocator {} at {}: {}; retrying in {} ms", name,
              settings.address(), describe(e.getStatus()), backoff.toMillis());
          sleep(backoff);
          backoff = backoff.multipliedBy(2).compareTo(MAX_BACKOFF) > 0
              ? MAX_BACKOFF : backoff.multipliedBy(2);
          continue;
        }
        if (code == Status.Code.NOT_FOUND && startAgainOnNotFound && !startedAgain) {
          startedAgain = true;
          LOG.warn("spark-pod-allocator {} answered {}: the service lost the application (a"
              + " restart without its registration?); starting it again", name,
              describe(e.getStatus()));
          startAgain();
          continue;
        }
        throw new AllocatorServiceException(name, e);
      }
    }
  }

  /**
   * Gives a service that lost the application what its registration held: Start with every
   * template sent so far, then the last targets and registered executors.
   */
  private void startAgain() {
    StartRequest request;
    Map<Integer, Integer> lastTargets;
    List<String> lastRegistered;
    Map<String, Integer> lastRunningTasks;
    synchronized (this) {
      request = start.toBuilder()
          .clearResourceProfileTemplates()
          .putAllResourceProfileTemplates(templates.tailMap(DEFAULT_PROFILE, false))
          .build();
      lastTargets = new TreeMap<>(targets);
      lastRegistered = registered == null ? null : new ArrayList<>(registered);
      lastRunningTasks = runningTasks;
    }
    StartResponse response = call("Start", s -> s.start(request), false, settings.retryTimeout());
    LOG.info("spark-pod-allocator started application {} again (resumed: {}, last executor id:"
        + " {})", request.getApplicationId(), response.getResumed(), response.getLastExecutorId());
    if (!lastTargets.isEmpty()) {
      SetTotalExpectedRequest.Builder targetsRequest =
          SetTotalExpectedRequest.newBuilder().setApplicationId(request.getApplicationId());
      lastTargets.forEach((profile, total) -> targetsRequest.putExecutorsPerProfile(profile, total));
      SetTotalExpectedRequest built = targetsRequest.build();
      call("SetTotalExpected", s -> s.setTotalExpected(built), false, settings.retryTimeout());
    }
    if (lastRegistered != null) {
      UpdateRegisteredExecutorsRequest registeredRequest =
          UpdateRegisteredExecutorsRequest.newBuilder()
              .setApplicationId(request.getApplicationId())
              .addAllExecutorIds(lastRegistered)
              .putAllRunningTasks(lastRunningTasks)
              .build();
      call("UpdateRegisteredExecutors", s -> s.updateRegisteredExecutors(registeredRequest), false,
          settings.retryTimeout());
    }
  }

  /** The code and description of a status, without its cause's stack trace. */
  private static String describe(Status status) {
    return status.getDescription() == null
        ? status.getCode().toString() : status.getCode() + ": " + status.getDescription();
  }

  private static void sleep(Duration duration) {
    try {
      Thread.sleep(duration.toMillis());
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new AllocatorServiceException("interrupted while waiting to retry", e);
    }
  }

  /** Adds {@code authorization: Bearer <token>}, re-reading the file as tokens rotate. */
  private static final class BearerToken implements ClientInterceptor {
    private static final long REREAD_NANOS = TimeUnit.SECONDS.toNanos(30);
    private final Path file;
    private Optional<String> token = Optional.empty();
    private long readAt;

    BearerToken(Path file) {
      this.file = file;
    }

    private synchronized Optional<String> token() {
      if (token.isEmpty() || System.nanoTime() - readAt > REREAD_NANOS) {
        try {
          String read = Files.readString(file, StandardCharsets.UTF_8).trim();
          token = read.isEmpty() ? Optional.empty() : Optional.of(read);
          readAt = System.nanoTime();
        } catch (IOException e) {
          LOG.warn("Cannot read the bearer token file {} (set by {}); keeping the last token",
              file, ServiceSettings.TOKEN_FILE, e);
        }
      }
      return token;
    }

    @Override
    public <ReqT, RespT> ClientCall<ReqT, RespT> interceptCall(
        MethodDescriptor<ReqT, RespT> method, CallOptions options, Channel next) {
      Optional<String> current = token();
      return new ForwardingClientCall.SimpleForwardingClientCall<>(next.newCall(method, options)) {
        @Override
        public void start(Listener<RespT> listener, Metadata headers) {
          current.ifPresent(t -> headers.put(AUTHORIZATION, "Bearer " + t));
          super.start(listener, headers);
        }
      };
    }
  }
}
