//! Serving over real gRPC: the happy path of a driver, health, reflection (v1 and v1alpha)
//! and a graceful shutdown that leaves executor pods in place.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::watcher;
use spark_pod_allocator::grpc::server::SERVICE_NAME;
use spark_pod_allocator::proto;
use test_kit::grpc::{Harness, TEMPLATE, start_request, start_scaled};
use test_kit::requests::*;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// Guards against a hang only; the waits below end on events, not on time.
const HANG_GUARD: Duration = Duration::from_secs(30);

/// Waits, on a watch of the API server, until `count` executor pods of `app` exist.
async fn until_pods_exist(
    h: &Harness,
    namespace: &str,
    app: &str,
    count: usize,
) -> BTreeSet<String> {
    let api: Api<Pod> = Api::namespaced(h.sim.try_client().expect("sim client"), namespace);
    let config =
        watcher::Config::default().labels(&format!("spark-app-selector={app},spark-role=executor"));
    let mut events = watcher(api, config).boxed();
    let mut names = BTreeSet::new();
    let wait = async {
        while let Some(event) = events.next().await {
            match event.expect("watch event") {
                watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => {
                    names.insert(pod.metadata.name.clone().unwrap_or_default());
                }
                watcher::Event::Delete(pod) => {
                    names.remove(&pod.metadata.name.clone().unwrap_or_default());
                }
                watcher::Event::Init | watcher::Event::InitDone => {}
            }
            if names.len() >= count {
                return;
            }
        }
    };
    tokio::time::timeout(HANG_GUARD, wait)
        .await
        .expect("pods appear");
    names
}

#[tokio::test]
async fn a_driver_starts_scales_asks_and_stops() {
    let mut h = Harness::start().await;
    let app = "spark-happy";
    let mut request = start_request(app, "team-a");
    request.resource_profile_templates = HashMap::from([(4, TEMPLATE.into())]);
    let started = h.client.start(request).await.expect("start").into_inner();
    assert_eq!((started.resumed, started.last_executor_id), (false, 0));
    // Before any SetTotalExpected, every profile with a template is listed, with target 0.
    let status = h
        .client
        .get_status(status_request(app))
        .await
        .expect("status after start")
        .into_inner();
    let zero = |id| proto::ProfileStatus {
        resource_profile_id: id,
        ..Default::default()
    };
    assert_eq!(status.profiles, vec![zero(0), zero(4)]);

    h.client
        .set_total_expected(targets_request(app, 3))
        .await
        .expect("set total");
    // Nothing was outstanding, so the round ran at once: three pods, without the clock moving.
    let names = until_pods_exist(&h, "team-a", app, 3).await;
    assert_eq!(
        names,
        BTreeSet::from([
            "spark-happy-exec-1".into(),
            "spark-happy-exec-2".into(),
            "spark-happy-exec-3".into()
        ])
    );

    let status = h
        .client
        .get_status(status_request(app))
        .await
        .expect("status")
        .into_inner();
    assert_eq!(status.last_executor_id, 3);
    let p0 = status
        .profiles
        .iter()
        .find(|p| p.resource_profile_id == 0)
        .expect("profile 0");
    assert_eq!(p0.target, 3);
    assert_eq!(p0.running, 0);
    assert_eq!(p0.pending + p0.newly_created, 3, "{p0:?}");
    assert!(status.outstanding);
    assert!(status.deleted_executor_ids.is_empty());

    let deleted = h
        .client
        .is_deleted(is_deleted_request(app, "2"))
        .await
        .expect("is deleted")
        .into_inner();
    assert!(!deleted.deleted);
    h.client
        .update_registered_executors(proto::UpdateRegisteredExecutorsRequest {
            application_id: app.into(),
            executor_ids: vec!["1".into(), "2".into()],
            running_tasks: Default::default(),
        })
        .await
        .expect("registered");

    let stopped = h
        .client
        .stop(stop_request(app))
        .await
        .expect("stop")
        .into_inner();
    assert_eq!(stopped.deleted_pods, 3);
    assert!(h.pods("team-a", app).await.is_empty());
    let status = h
        .client
        .get_status(status_request(app))
        .await
        .expect_err("forgotten");
    assert_eq!(status.code(), tonic::Code::NotFound);
    h.stop_server().await;
}

#[tokio::test]
async fn health_is_not_serving_until_the_kubernetes_watch_has_synced() {
    let mut sim = test_kit::grpc::quiet_cluster();
    // Every API request fails until the fault is lifted, `/version` too: the service
    // cannot sync, and its probe of the API server is not answered before the test says.
    sim.faults.error_500_fraction = 1.0;
    sim.faults.discovery_faults = true;
    let mut h = Harness::start_with(sim, Default::default()).await;
    let mut health = HealthClient::new(h.channel.clone());
    let mut updates = health
        .watch(HealthCheckRequest {
            service: SERVICE_NAME.into(),
        })
        .await
        .expect("watch")
        .into_inner();
    let first = updates.message().await.expect("first").expect("an update");
    assert_eq!(first.status, ServingStatus::NotServing as i32);
    let overall = health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("check")
        .into_inner();
    assert_eq!(overall.status, ServingStatus::NotServing as i32);

    let mut faults = h.sim.faults();
    faults.error_500_fraction = 0.0;
    h.sim.set_faults(faults);
    let next = tokio::time::timeout(HANG_GUARD, updates.message())
        .await
        .expect("an update after the fault is lifted")
        .expect("stream")
        .expect("an update");
    assert_eq!(next.status, ServingStatus::Serving as i32);
    let overall = health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("check")
        .into_inner();
    assert_eq!(overall.status, ServingStatus::Serving as i32);
    // An open Watch would hold the graceful shutdown until the drain timeout.
    drop(updates);
    h.stop_server().await;
}

mod reflection {
    use super::*;
    use http::uri::PathAndQuery;
    use tonic_prost::ProstCodec;

    /// Lists services through one reflection version (`v1` or `v1alpha`).
    macro_rules! list_services {
        ($channel:expr, $version:ident) => {{
            use tonic_reflection::pb::$version::server_reflection_request::MessageRequest;
            use tonic_reflection::pb::$version::server_reflection_response::MessageResponse;
            use tonic_reflection::pb::$version::{
                ServerReflectionRequest, ServerReflectionResponse,
            };
            let mut grpc = tonic::client::Grpc::new($channel);
            grpc.ready().await.expect("ready");
            let path = PathAndQuery::from_static(concat!(
                "/grpc.reflection.",
                stringify!($version),
                ".ServerReflection/ServerReflectionInfo"
            ));
            let request = ServerReflectionRequest {
                host: String::new(),
                message_request: Some(MessageRequest::ListServices(String::new())),
            };
            let codec = ProstCodec::<ServerReflectionRequest, ServerReflectionResponse>::default();
            let mut replies = grpc
                .streaming(
                    tonic::Request::new(futures::stream::iter([request])),
                    path,
                    codec,
                )
                .await
                .expect("reflection call")
                .into_inner();
            let reply = replies.message().await.expect("reply").expect("one reply");
            match reply.message_response {
                Some(MessageResponse::ListServicesResponse(list)) => list
                    .service
                    .into_iter()
                    .map(|s| s.name)
                    .collect::<BTreeSet<String>>(),
                other => panic!("unexpected reflection reply {other:?}"),
            }
        }};
    }

    #[tokio::test]
    async fn both_versions_list_the_allocator_and_health() {
        let mut h = Harness::start().await;
        for names in [
            list_services!(h.channel.clone(), v1alpha),
            list_services!(h.channel.clone(), v1),
        ] {
            assert!(
                names.contains("spark.allocator.v1.ExecutorAllocator"),
                "{names:?}"
            );
            assert!(names.contains("grpc.health.v1.Health"), "{names:?}");
        }
        h.stop_server().await;
    }
}

#[tokio::test]
async fn a_graceful_shutdown_leaves_executor_pods_in_place() {
    let mut h = Harness::start().await;
    let app = "spark-kept";
    start_scaled(&mut h.client, start_request(app, "team-b"), 2).await;
    until_pods_exist(&h, "team-b", app, 2).await;

    // A call in flight when the shutdown begins (a health Watch) is still served.
    let mut health = HealthClient::new(h.channel.clone());
    let mut updates = health
        .watch(HealthCheckRequest {
            service: SERVICE_NAME.into(),
        })
        .await
        .expect("watch")
        .into_inner();
    loop {
        let update = updates.message().await.expect("update").expect("an update");
        if update.status == ServingStatus::Serving as i32 {
            break;
        }
    }
    h.signal_stop();
    let update = updates.message().await.expect("update").expect("an update");
    assert_eq!(update.status, ServingStatus::NotServing as i32);
    drop(updates);
    h.wait_stopped().await;
    assert_eq!(h.pods("team-b", app).await.len(), 2);
    // The actors are stopped, not the application: its pods wait for a restarted service.
    let app_id = spark_pod_allocator::app::AppId::parse(app).expect("id");
    assert!(matches!(
        h.applications.status(&app_id).await,
        Err(spark_pod_allocator::app::AppError::ShuttingDown)
    ));
    // The listener is closed: new calls fail.
    let reconnect = tonic::transport::Endpoint::from_shared(format!("http://{}", h.address))
        .expect("endpoint")
        .connect()
        .await;
    assert!(reconnect.is_err());
}

#[tokio::test]
async fn a_restarted_service_resumes_the_application_without_reusing_an_id() {
    let mut h = Harness::start().await;
    let app = "spark-resumed";
    start_scaled(&mut h.client, start_request(app, "team-a"), 3).await;
    until_pods_exist(&h, "team-a", app, 3).await;

    h.restart().await;
    let resumed = h
        .client
        .start(start_request(app, "team-a"))
        .await
        .expect("start after restart")
        .into_inner();
    assert_eq!((resumed.resumed, resumed.last_executor_id), (true, 3));
    h.client
        .set_total_expected(targets_request(app, 5))
        .await
        .expect("set total after restart");
    // The resumed pods are pending (outstanding), so the new target waits for the next
    // round rather than running one at once: let one batch delay pass.
    h.clock.advance(Duration::from_secs(1));
    let names = until_pods_exist(&h, "team-a", app, 5).await;
    let expected: BTreeSet<String> = (1..=5).map(|id| format!("{app}-exec-{id}")).collect();
    assert_eq!(names, expected);

    let stopped = h
        .client
        .stop(stop_request(app))
        .await
        .expect("stop")
        .into_inner();
    assert_eq!(stopped.deleted_pods, 5);
    h.stop_server().await;
}
