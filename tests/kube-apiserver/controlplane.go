package main

// The rest of a control plane, for the tests that need what a cluster does by itself: the
// kube-scheduler binds pods to nodes, the kube-controller-manager collects the garbage of
// deleted owners, finalizes deleted namespaces and gives each namespace its `default`
// ServiceAccount, and kwok fakes nodes and plays the kubelet's part on them (pods go Running,
// or fail, as their labels and annotations ask).
//
// Each runs as a subcommand of this binary in its own process (so their global flags, metrics
// and signal handlers stay apart) and shares the one Go build. The API server process starts
// them after /readyz answers, and stops them before it stops itself.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	nodefast "sigs.k8s.io/kwok/kustomize/stage/node/fast"
	podfast "sigs.k8s.io/kwok/kustomize/stage/pod/fast"
	kwokconfig "sigs.k8s.io/kwok/pkg/config"
	kwokcmd "sigs.k8s.io/kwok/pkg/kwok/cmd"
	kwoklog "sigs.k8s.io/kwok/pkg/log"
	kwoksignals "sigs.k8s.io/kwok/pkg/utils/signals"
)

// The subcommands of this binary that run one control-plane component each.
const (
	schedulerCommand         = "kube-scheduler"
	controllerManagerCommand = "kube-controller-manager"
	kwokCommand              = "kwok"
)

// The controllers the tests rely on: ownerReference garbage collection, namespace deletion and
// the default ServiceAccount (with the tokens the controllers' own accounts need); for the
// Helm chart installed for real, what makes its objects real: Deployments get ReplicaSets and
// those their pods, a Service its EndpointSlices, a PodDisruptionBudget its status, and the
// aggregated ClusterRoles (admin, edit, view) their rules, so that a namespace admin can be
// given `admin` as in any cluster. For the budgets' tests, the resourcequota controller:
// a ResourceQuota gets its status (hard, used), without which the quota admission plugin
// refuses every pod it counts. For the process node's pods, the root CA publisher: every
// namespace's kube-root-ca.crt ConfigMap, which the ServiceAccount admission's token volume
// projects as ca.crt.
const controllers = "garbage-collector-controller,namespace-controller,serviceaccount-controller,serviceaccount-token-controller," +
	"deployment-controller,replicaset-controller,endpointslice-controller,disruption-controller,clusterrole-aggregation-controller," +
	"resourcequota-controller,root-ca-certificate-publisher-controller"

// The label of the nodes kwok manages, as in kwok's own documentation.
const kwokNodeLabel = "type=kwok"

// runComponent runs a control-plane subcommand and reports whether args named one.
func runComponent(args []string) (bool, error) {
	if len(args) == 0 {
		return false, nil
	}
	rest := args[1:]
	switch args[0] {
	case schedulerCommand:
		cmd := scheduler.NewSchedulerCommand()
		cmd.SetArgs(rest)
		return true, cmd.Execute()
	case controllerManagerCommand:
		cmd := controllermanager.NewControllerManagerCommand()
		cmd.SetArgs(rest)
		return true, cmd.Execute()
	case kwokCommand:
		return true, runKwok(rest)
	}
	return false, nil
}

// runKwok is kwok's own main (sigs.k8s.io/kwok/cmd/kwok) with its arguments given.
func runKwok(args []string) error {
	// The Kubernetes packages linked in register flags on pflag's global set (--version among
	// them, which clashes with cobra's); kwok's command knows none of them.
	pflag.CommandLine = pflag.NewFlagSet(kwokCommand, pflag.ExitOnError)
	flagset := pflag.NewFlagSet("global", pflag.ContinueOnError)
	flagset.ParseErrorsAllowlist.UnknownFlags = true
	flagset.Usage = func() {}
	ctx := kwoksignals.SetupSignalContext()
	ctx, _ = kwoklog.InitFlags(ctx, flagset)
	ctx, err := kwokconfig.InitFlags(ctx, flagset)
	if err != nil {
		return err
	}
	cmd := kwokcmd.NewCommand(ctx)
	cmd.PersistentFlags().AddFlagSet(flagset)
	cmd.SetArgs(args)
	return cmd.ExecuteContext(ctx)
}

// controlPlaneOptions are the flags of the API server process that shape the control plane.
type controlPlaneOptions struct {
	enabled      bool
	nodes        int
	runningDelay time.Duration
	schedulerQPS float64
}

// controlPlane is the set of running component processes.
type controlPlane struct {
	processes []*exec.Cmd
}

// startControlPlane writes the components' files, registers the kwok nodes, starts the
// components and waits until they act: the nodes are Ready (kwok runs) and the `default`
// namespace has its ServiceAccount (the controller-manager runs).
func startControlPlane(ctx context.Context, dir string, opts controlPlaneOptions) (*controlPlane, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "kwok.yaml"), []byte(kwokConfig(opts.runningDelay)), 0o600); err != nil {
		return nil, err
	}
	client, err := adminClient(dir)
	if err != nil {
		return nil, err
	}
	for i := 0; i < opts.nodes; i++ {
		if err := registerNode(ctx, client, fmt.Sprintf("kwok-node-%d", i)); err != nil {
			return nil, err
		}
	}
	cp := &controlPlane{}
	components := [][]string{
		{schedulerCommand,
			"--kubeconfig=" + componentKubeconfig(dir, schedulerUser),
			"--leader-elect=false",
			"--secure-port=0",
		},
		{controllerManagerCommand,
			"--kubeconfig=" + componentKubeconfig(dir, controllerManagerUser),
			"--controllers=" + controllers,
			"--use-service-account-credentials=true",
			"--service-account-private-key-file=" + filepath.Join(dir, "sa.key"),
			"--root-ca-file=" + filepath.Join(dir, "ca.crt"),
			"--leader-elect=false",
			"--secure-port=0",
		},
		{kwokCommand,
			"--kubeconfig=" + filepath.Join(dir, "kubeconfig"),
			"--config=" + filepath.Join(dir, "kwok.yaml"),
			"--manage-nodes-with-label-selector=" + kwokNodeLabel,
			"--node-lease-duration-seconds=0",
		},
	}
	// Each bind is one request: at the default 50 QPS the scheduler, not the API server, bounds
	// how fast pods start (the benchmarks lift it to measure the API server's own limit).
	if opts.schedulerQPS > 0 {
		components[0] = append(components[0],
			fmt.Sprintf("--kube-api-qps=%g", opts.schedulerQPS),
			fmt.Sprintf("--kube-api-burst=%d", int(2*opts.schedulerQPS)))
	}
	for _, args := range components {
		if err := cp.spawn(self, dir, args); err != nil {
			cp.stop()
			return nil, err
		}
	}
	if err := waitActing(ctx, client, opts.nodes); err != nil {
		cp.stop()
		return nil, err
	}
	return cp, nil
}

// spawn starts one component with its output in <dir>/<component>.log. The component dies
// with this process even when this one is killed.
func (cp *controlPlane) spawn(self, dir string, args []string) error {
	log, err := os.OpenFile(filepath.Join(dir, args[0]+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command(self, args...)
	cmd.Stdout = log
	cmd.Stderr = log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: %w", args[0], err)
	}
	cp.processes = append(cp.processes, cmd)
	return nil
}

// stop asks every component to stop, and kills those still running after five seconds.
func (cp *controlPlane) stop() {
	if cp == nil {
		return
	}
	for _, p := range cp.processes {
		_ = p.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range cp.processes {
		done := make(chan struct{})
		go func() { _ = p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = p.Process.Kill()
			<-done
		}
	}
	cp.processes = nil
}

func adminClient(dir string) (*kubernetes.Clientset, error) {
	config, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "kubeconfig"))
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(config)
}

// registerNode creates a node for kwok, as a kubelet registers itself (again after a restart:
// the node is kept).
func registerNode(ctx context.Context, client *kubernetes.Clientset, name string) error {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("32"),
		corev1.ResourceMemory: resource.MustParse("256Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: name,
			Labels: map[string]string{
				"type":                   "kwok",
				"kubernetes.io/hostname": name,
				"kubernetes.io/os":       "linux",
			},
			Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"},
		},
		Status: corev1.NodeStatus{Capacity: capacity, Allocatable: capacity},
	}
	created, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	if err != nil {
		return err
	}
	// The API server taints a new node not-ready; the node-lifecycle controller lifts the taint
	// once the node is Ready. That controller does not run here (it would also evict the pods of
	// nodes whose kubelet lease kwok does not renew), so the node starts untainted.
	created.Spec.Taints = nil
	_, err = client.CoreV1().Nodes().Update(ctx, created, metav1.UpdateOptions{})
	return err
}

// waitActing waits until kwok has made the nodes Ready and the controller-manager has given
// the `default` namespace its ServiceAccount.
func waitActing(ctx context.Context, client *kubernetes.Clientset, nodes int) error {
	deadline := time.Now().Add(120 * time.Second)
	for {
		ready, err := readyNodes(ctx, client)
		if err == nil && ready >= nodes {
			_, err = client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
			if err == nil {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return errors.Join(errors.New("the control plane did not act within 120 s (see kwok.log, kube-controller-manager.log)"), err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func readyNodes(ctx context.Context, client *kubernetes.Clientset) (int, error) {
	list, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: kwokNodeLabel})
	if err != nil {
		return 0, err
	}
	ready := 0
	for _, n := range list.Items {
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				ready++
			}
		}
	}
	return ready, nil
}

// The label that picks a pod's fate on a kwok node, and the annotations that tune it. Without
// the label a pod goes Running after its delay.
const (
	outcomeLabel           = "spark-pod-allocator.test/kwok-outcome"
	runningDelayAnnotation = "spark-pod-allocator.test/kwok-running-delay"
	exitDelayAnnotation    = "spark-pod-allocator.test/kwok-exit-delay"
	exitCodeAnnotation     = "spark-pod-allocator.test/kwok-exit-code"
)

// kwokConfig is kwok's configuration: its own node-initialize and pod-delete stages, a
// pod-ready stage with a delay, the failures a kubelet reports: a container that exits
// with a code (outcome "exit") and an image that cannot be pulled (outcome "image-pull-backoff"),
// and the success of a `helm test` pod.
func kwokConfig(runningDelay time.Duration) string {
	stages := []string{
		nodefast.DefaultNodeInit,
		strings.ReplaceAll(strings.ReplaceAll(podReadyStage, "DELAY_MS", fmt.Sprint(runningDelay.Milliseconds())), "OUTCOME", outcomeLabel),
		strings.NewReplacer("OUTCOME", outcomeLabel, "EXIT_DELAY", exitDelayAnnotation, "EXIT_CODE", exitCodeAnnotation).Replace(podExitStage),
		strings.ReplaceAll(podImagePullBackOffStage, "OUTCOME", outcomeLabel),
		podHelmTestStage,
		podfast.DefaultPodDelete,
	}
	return strings.ReplaceAll(strings.Join(stages, "\n---\n"), "RUNNING_DELAY", runningDelayAnnotation)
}

// podReadyStage is kwok's fast pod-ready stage with a delay (the process-wide default, or the
// pod's annotation) and without the pods whose image cannot be pulled.
const podReadyStage = `apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-ready
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Pending']
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'NotIn'
      values: ['True']
    - key: '.metadata.labels["OUTCOME"]'
      operator: 'NotIn'
      values: ['image-pull-backoff']
  delay:
    durationMilliseconds: DELAY_MS
    durationFrom:
      expressionFrom: '.metadata.annotations["RUNNING_DELAY"]'
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: Initialized
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: Ready
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: ContainersReady
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: true
        restartCount: 0
        started: true
        state:
          running:
            startedAt: {{ $now | Quote }}
      {{ end }}
      hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
      podIP: {{ PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) | Quote }}
      phase: Running
      startTime: {{ $now | Quote }}
`

// podExitStage fails a Running pod whose outcome is "exit": every container terminated with
// the annotated exit code (1 by default), after the annotated delay.
const podExitStage = `apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-exit
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.metadata.labels["OUTCOME"]'
      operator: 'In'
      values: ['exit']
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
  delay:
    durationMilliseconds: 0
    durationFrom:
      expressionFrom: '.metadata.annotations["EXIT_DELAY"]'
  next:
    statusTemplate: |
      {{ $now := Now }}
      {{ $annotations := or .metadata.annotations dict }}
      {{ $exitCode := or ( index $annotations "EXIT_CODE" ) 1 }}
      conditions:
      - lastTransitionTime: {{ $now | Quote }}
        status: "False"
        reason: PodFailed
        type: Ready
      - lastTransitionTime: {{ $now | Quote }}
        status: "False"
        reason: PodFailed
        type: ContainersReady
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: {{ $exitCode }}
            reason: Error
            finishedAt: {{ $now | Quote }}
      {{ end }}
      phase: Failed
`

// podImagePullBackOffStage keeps a pod whose outcome is "image-pull-backoff" Pending with its
// containers waiting, as a kubelet reports an image it cannot pull.
const podImagePullBackOffStage = `apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-image-pull-backoff
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.metadata.labels["OUTCOME"]'
      operator: 'In'
      values: ['image-pull-backoff']
    - key: '.status.phase'
      operator: 'In'
      values: ['Pending']
    - key: '.status.containerStatuses.[0].state.waiting.reason'
      operator: 'NotIn'
      values: ['ImagePullBackOff']
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: Initialized
      - lastTransitionTime: {{ $now | Quote }}
        status: "False"
        reason: ContainersNotReady
        type: Ready
      - lastTransitionTime: {{ $now | Quote }}
        status: "False"
        reason: ContainersNotReady
        type: ContainersReady
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        restartCount: 0
        started: false
        state:
          waiting:
            reason: ImagePullBackOff
            message: {{ printf "Back-off pulling image %q" .image | Quote }}
      {{ end }}
      hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
      phase: Pending
      startTime: {{ $now | Quote }}
`

// podHelmTestStage completes a Running `helm test` pod (annotation helm.sh/hook: test, or its
// older spelling test-success): every container terminated with exit code 0, phase Succeeded,
// as a kubelet reports a test that passed. kwok runs no container, so the test's own check
// (the chart's grpc_health_probe) is not made; what is exercised is the pod's admission, the
// hook's flow (helm creates the pod, waits for its phase, deletes it by its delete policy) and
// its cleanup.
const podHelmTestStage = `apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-helm-test-succeeded
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.metadata.annotations["helm.sh/hook"]'
      operator: 'In'
      values: ['test', 'test-success']
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - lastTransitionTime: {{ $now | Quote }}
        status: "False"
        reason: PodCompleted
        type: Ready
      - lastTransitionTime: {{ $now | Quote }}
        status: "False"
        reason: PodCompleted
        type: ContainersReady
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: 0
            reason: Completed
            finishedAt: {{ $now | Quote }}
      {{ end }}
      phase: Succeeded
`
