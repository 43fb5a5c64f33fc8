// Command test-apiserver runs a real kube-apiserver over an embedded etcd on loopback, for the
// project's tests: the contract tests hold the service (and the simulator) to what a real API
// server does, with token authentication, RBAC, service-account tokens and an audit log.
//
// Everything lives in one directory (--dir): etcd's data, the CA and serving certificate, the
// service-account signing key, the static token file, the audit policy and log, the admin
// kubeconfig and the chosen ports. Started again on the same directory it serves the same
// data on the same ports with the same credentials, which is how a test restarts the API server.
//
// When the API server answers /readyz it prints "ready <url>" on stdout. A second loopback
// listener (the control port, plain HTTP) lets a test inject faults into etcd:
// POST /compact compacts etcd at its current revision, POST /etcd/stop?seconds=N stops etcd
// and starts it again after N seconds. SIGTERM or SIGINT shuts both servers down cleanly, and
// so does the end of stdin with --exit-with-stdin.
//
// With --control-plane it also runs a kube-scheduler, a kube-controller-manager and kwok with
// --kwok-nodes fake nodes (controlplane.go), and is ready when they act.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

// Users in the static token file. The admin is in system:masters; the others have no role
// until a test binds one, so a test can show that RBAC refuses them.
var tokenUsers = []struct{ name, groups string }{
	{"admin", "system:masters"},
	{"alice", ""},
	{"bob", ""},
	{schedulerUser, ""},
	{controllerManagerUser, ""},
}

// The users the bootstrap RBAC policy binds to the scheduler's and controller-manager's roles.
const (
	schedulerUser         = "system:kube-scheduler"
	controllerManagerUser = "system:kube-controller-manager"
)

// auditPolicy logs the requests of every client but the API server's own loopback client;
// pod and configmap writes carry their request body.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: None
  users: ["system:apiserver"]
- level: None
  nonResourceURLs: ["/readyz*", "/livez*", "/healthz*"]
- level: Request
  verbs: ["create", "update", "patch", "delete", "deletecollection"]
  resources:
  - group: ""
    resources: ["pods", "pods/binding", "pods/status", "configmaps"]
- level: Metadata
`

// state is what a restart on the same directory must find again.
type state struct {
	APIPort     int               `json:"apiPort"`
	ControlPort int               `json:"controlPort"`
	EtcdClient  int               `json:"etcdClientPort"`
	EtcdPeer    int               `json:"etcdPeerPort"`
	Tokens      map[string]string `json:"tokens"`
}

func main() {
	if ran, err := runComponent(os.Args[1:]); ran {
		if err != nil {
			fmt.Fprintln(os.Stderr, "test-apiserver:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "test-apiserver:", err)
		os.Exit(1)
	}
}

func run() error {
	dir := flag.String("dir", "", "directory for etcd data, keys, tokens, kubeconfig and audit log (created if absent)")
	port := flag.Int("port", 0, "secure port of the API server (0: a free port, kept for restarts on the same --dir)")
	verbosity := flag.Int("v", 0, "kube-apiserver log verbosity")
	ephemeral := flag.Bool("ephemeral", false, "remove --dir on exit (for a server that is never restarted)")
	exitWithStdin := flag.Bool("exit-with-stdin", false, "shut down (as on SIGTERM) when stdin closes, so a test's server never outlives the test process")
	var cpOpts controlPlaneOptions
	flag.BoolVar(&cpOpts.enabled, "control-plane", false, "also run kube-scheduler, kube-controller-manager and kwok (fake nodes and kubelets)")
	flag.IntVar(&cpOpts.nodes, "kwok-nodes", 2, "how many nodes kwok fakes (with --control-plane)")
	flag.DurationVar(&cpOpts.runningDelay, "kwok-running-delay", 0, "how long a pod bound to a kwok node stays Pending before Running, unless its annotation says otherwise")
	flag.Float64Var(&cpOpts.schedulerQPS, "scheduler-qps", 0, "the kube-scheduler's client QPS (burst twice that); 0 keeps its default of 50, which bounds binds per second")
	flag.Parse()
	if *dir == "" {
		return errors.New("--dir is required")
	}
	abs, err := filepath.Abs(*dir)
	if err != nil {
		return err
	}
	if *ephemeral {
		defer os.RemoveAll(abs)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return err
	}
	st, err := loadOrCreateState(abs, *port)
	if err != nil {
		return err
	}
	if err := writeFixtures(abs, st); err != nil {
		return err
	}

	etcd := &etcdProcess{cfg: etcdConfig(abs, st)}
	if err := etcd.start(); err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	defer etcd.stop()

	control, err := serveControl(st.ControlPort, etcd)
	if err != nil {
		return err
	}
	defer control.Close()

	cmd := app.NewAPIServerCommand()
	if *exitWithStdin {
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			_ = syscall.Kill(os.Getpid(), syscall.SIGTERM)
		}()
	}
	// Arguments after "--" go to kube-apiserver as they are (e.g. --watch-cache=false).
	cmd.SetArgs(append(apiserverArgs(abs, st, *verbosity), flag.Args()...))
	done := make(chan error, 1)
	go func() { done <- cmd.Execute() }()

	apiURL := fmt.Sprintf("https://127.0.0.1:%d", st.APIPort)
	stopped := make(chan struct{})
	controlPlaneUp := make(chan *controlPlane, 1)
	go func() {
		if !waitReady(apiURL, abs, st.Tokens["admin"], stopped) {
			return
		}
		if cpOpts.enabled {
			ctx, cancel := context.WithCancel(context.Background())
			go func() { <-stopped; cancel() }()
			cp, err := startControlPlane(ctx, abs, cpOpts)
			if err != nil {
				fmt.Fprintln(os.Stderr, "test-apiserver: control plane:", err)
				_ = syscall.Kill(os.Getpid(), syscall.SIGTERM)
				return
			}
			controlPlaneUp <- cp
		}
		fmt.Printf("ready %s\n", apiURL)
	}()
	// The command returns when its signal context ends (SIGTERM/SIGINT) or it fails to start.
	err = <-done
	close(stopped)
	select {
	case cp := <-controlPlaneUp:
		cp.stop()
	default:
	}
	return err
}

func loadOrCreateState(dir string, port int) (*state, error) {
	path := filepath.Join(dir, "state.json")
	if data, err := os.ReadFile(path); err == nil {
		var st state
		if err := json.Unmarshal(data, &st); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if port != 0 && port != st.APIPort {
			return nil, fmt.Errorf("%s was made for port %d, not %d", path, st.APIPort, port)
		}
		return &st, addTokens(path, &st)
	}
	ports, err := freePorts(4)
	if err != nil {
		return nil, err
	}
	st := state{APIPort: ports[0], ControlPort: ports[1], EtcdClient: ports[2], EtcdPeer: ports[3], Tokens: map[string]string{}}
	if port != 0 {
		st.APIPort = port
	}
	return &st, addTokens(path, &st)
}

// addTokens gives every user without a token one, and saves the state.
func addTokens(path string, st *state) error {
	for _, u := range tokenUsers {
		if st.Tokens[u.name] != "" {
			continue
		}
		b := make([]byte, 24)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		st.Tokens[u.name] = hex.EncodeToString(b)
	}
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o600)
}

// freePorts asks the kernel for distinct free loopback ports, all held until all are chosen.
func freePorts(n int) ([]int, error) {
	var ports []int
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			_ = l.Close()
		}
	}()
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// writeFixtures writes the files the API server reads, once: keys and certificates stay the
// same across restarts so that tokens issued before a restart remain valid.
func writeFixtures(dir string, st *state) error {
	if _, err := os.Stat(filepath.Join(dir, "ca.crt")); err != nil {
		if err := writeCertificates(dir); err != nil {
			return err
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "sa.key")); err != nil {
		key, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			return err
		}
		der := x509.MarshalPKCS1PrivateKey(key)
		if err := writePEM(filepath.Join(dir, "sa.key"), "RSA PRIVATE KEY", der); err != nil {
			return err
		}
	}
	var tokens []byte
	for i, u := range tokenUsers {
		tokens = fmt.Appendf(tokens, "%s,%s,%d", st.Tokens[u.name], u.name, 1000+i)
		if u.groups != "" {
			tokens = fmt.Appendf(tokens, ",\"%s\"", u.groups)
		}
		tokens = append(tokens, '\n')
	}
	if err := os.WriteFile(filepath.Join(dir, "tokens.csv"), tokens, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "audit-policy.yaml"), []byte(auditPolicy), 0o600); err != nil {
		return err
	}
	for _, user := range []string{schedulerUser, controllerManagerUser} {
		if err := writeKubeconfig(componentKubeconfig(dir, user), dir, st.APIPort, user, st.Tokens[user]); err != nil {
			return err
		}
	}
	return writeKubeconfig(filepath.Join(dir, "kubeconfig"), dir, st.APIPort, "admin", st.Tokens["admin"])
}

// componentKubeconfig is where a control-plane component's kubeconfig is.
func componentKubeconfig(dir, user string) string {
	return filepath.Join(dir, "kubeconfig-"+strings.TrimPrefix(user, "system:"))
}

func writeKubeconfig(path, dir string, port int, user, token string) error {
	kubeconfig := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test-apiserver
  cluster:
    server: https://127.0.0.1:%d
    certificate-authority: %s
users:
- name: %[3]s
  user:
    token: %[4]s
contexts:
- name: %[3]s
  context:
    cluster: test-apiserver
    user: %[3]s
    namespace: default
current-context: %[3]s
`, port, filepath.Join(dir, "ca.crt"), user, token)
	return os.WriteFile(path, []byte(kubeconfig), 0o600)
}

// writeCertificates makes a CA and a serving certificate for 127.0.0.1 and localhost.
func writeCertificates(dir string) error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	caTemplate := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "test-apiserver-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	servingKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	servingTemplate := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:     []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
	}
	servingDER, err := x509.CreateCertificate(rand.Reader, servingTemplate, ca, &servingKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	servingKeyDER, err := x509.MarshalECPrivateKey(servingKey)
	if err != nil {
		return err
	}
	if err := writePEM(filepath.Join(dir, "serving.crt"), "CERTIFICATE", servingDER); err != nil {
		return err
	}
	if err := writePEM(filepath.Join(dir, "serving.key"), "EC PRIVATE KEY", servingKeyDER); err != nil {
		return err
	}
	// The CA last: its presence marks the set as complete.
	return writePEM(filepath.Join(dir, "ca.crt"), "CERTIFICATE", caDER)
}

func writePEM(path, kind string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600)
}

func apiserverArgs(dir string, st *state, verbosity int) []string {
	return []string{
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(st.APIPort),
		"--tls-cert-file=" + filepath.Join(dir, "serving.crt"),
		"--tls-private-key-file=" + filepath.Join(dir, "serving.key"),
		"--client-ca-file=" + filepath.Join(dir, "ca.crt"),
		"--etcd-servers=" + fmt.Sprintf("http://127.0.0.1:%d", st.EtcdClient),
		// Compaction happens only when a test asks for it (the control port's /compact).
		"--etcd-compaction-interval=0",
		"--token-auth-file=" + filepath.Join(dir, "tokens.csv"),
		"--anonymous-auth=false",
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + filepath.Join(dir, "sa.key"),
		"--service-account-signing-key-file=" + filepath.Join(dir, "sa.key"),
		"--api-audiences=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range=10.96.0.0/24",
		"--endpoint-reconciler-type=none",
		"--audit-policy-file=" + filepath.Join(dir, "audit-policy.yaml"),
		"--audit-log-path=" + filepath.Join(dir, "audit.log"),
		"--audit-log-mode=blocking",
		"--audit-log-maxsize=0",
		"--cert-dir=" + filepath.Join(dir, "certs"),
		"--v=" + strconv.Itoa(verbosity),
	}
}

func etcdConfig(dir string, st *state) *embed.Config {
	cfg := embed.NewConfig()
	cfg.Name = "test-apiserver"
	cfg.Dir = filepath.Join(dir, "etcd")
	client := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", st.EtcdClient)}
	peer := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", st.EtcdPeer)}
	cfg.ListenClientUrls = []url.URL{client}
	cfg.AdvertiseClientUrls = []url.URL{client}
	cfg.ListenPeerUrls = []url.URL{peer}
	cfg.AdvertisePeerUrls = []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{filepath.Join(dir, "etcd.log")}
	// Test data: durability across a machine crash is not needed, speed is.
	cfg.UnsafeNoFsync = true
	return cfg
}

// etcdProcess is the embedded etcd, which a fault injection may stop and start again.
type etcdProcess struct {
	mu  sync.Mutex
	cfg *embed.Config
	e   *embed.Etcd
}

func (p *etcdProcess) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, err := embed.StartEtcd(p.cfg)
	if err != nil {
		return err
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		e.Close()
		return errors.New("not ready after 60s")
	}
	p.e = e
	return nil
}

func (p *etcdProcess) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.e != nil {
		p.e.Close()
		p.e = nil
	}
}

// compact compacts etcd's history at its current revision, so that any watch or list from an
// older resourceVersion gets 410 Gone.
func (p *etcdProcess) compact(ctx context.Context) (int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.e == nil {
		return 0, errors.New("etcd is stopped")
	}
	client := v3client.New(p.e.Server)
	defer client.Close()
	resp, err := client.Get(ctx, "compaction-probe")
	if err != nil {
		return 0, err
	}
	rev := resp.Header.Revision
	if _, err := client.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		return 0, err
	}
	return rev, nil
}

func serveControl(port int, etcd *etcdProcess) (*http.Server, error) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /compact", func(w http.ResponseWriter, r *http.Request) {
		rev, err := etcd.compact(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, "%d\n", rev)
	})
	mux.HandleFunc("POST /etcd/stop", func(w http.ResponseWriter, r *http.Request) {
		seconds, err := strconv.Atoi(r.URL.Query().Get("seconds"))
		if err != nil || seconds < 1 || seconds > 60 {
			http.Error(w, "seconds: an integer from 1 to 60", http.StatusBadRequest)
			return
		}
		etcd.stop()
		go func() {
			time.Sleep(time.Duration(seconds) * time.Second)
			if err := etcd.start(); err != nil {
				fmt.Fprintln(os.Stderr, "test-apiserver: etcd did not start again:", err)
				os.Exit(1)
			}
		}()
		fmt.Fprintln(w, "stopped")
	})
	listener, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return nil, fmt.Errorf("control port: %w", err)
	}
	server := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = server.Serve(listener) }()
	return server, nil
}

// waitReady polls /readyz with the admin token until it answers 200, or the command ends.
func waitReady(apiURL, dir, token string, stopped <-chan struct{}) bool {
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return false
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	client := &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
	}
	for {
		req, err := http.NewRequest(http.MethodGet, apiURL+"/readyz", nil)
		if err != nil {
			return false
		}
		req.Header.Set("Authorization", "Bearer "+token)
		if resp, err := client.Do(req); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return true
			}
		}
		select {
		case <-stopped:
			return false
		case <-time.After(200 * time.Millisecond):
		}
	}
}
