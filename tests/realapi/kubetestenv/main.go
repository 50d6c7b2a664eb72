// Command kubetestenv runs a real kube-apiserver and an embedded etcd in one process, on
// loopback, for watchproxy's tests.
//
// It generates (or, with an existing -dir, reuses) a CA, a serving certificate, a
// service-account signing key and a static admin token, starts etcd, starts kube-apiserver with
// TLS, RBAC + Node authorization, API Priority and Fairness with a small budget, a short etcd
// compaction interval and the watch cache on, waits until /readyz answers "ok", and then writes
// a JSON description of the server (-ready-file) and an admin kubeconfig. SIGTERM or SIGINT
// stops the apiserver, then etcd, and the process exits 0.
//
// Restarting with the same -dir, -port and -etcd-port keeps etcd's data and the credentials, so
// a test can stop and restart "the cluster" under a client that keeps its address.
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
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
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

type settings struct {
	dir                string
	readyFile          string
	port               int
	etcdPort           int
	compactionInterval time.Duration
	maxInflight        int
	maxMutating        int
	readyTimeout       time.Duration
	verbosity          int
	extraArgs          []string
}

// readyInfo is what the tests read once the server answers; field names are the JSON contract
// with tests/realapi/fixture.py.
type readyInfo struct {
	URL        string `json:"url"`
	CAFile     string `json:"ca_file"`
	Token      string `json:"token"`
	Kubeconfig string `json:"kubeconfig"`
	PID        int    `json:"pid"`
	Dir        string `json:"dir"`
	EtcdURL    string `json:"etcd_url"`
	Port       int    `json:"port"`
	EtcdPort   int    `json:"etcd_port"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "kubetestenv:", err)
		os.Exit(1)
	}
}

func parseFlags() (settings, error) {
	var s settings
	var extra string
	flag.StringVar(&s.dir, "dir", "", "state directory (certificates, token, etcd data); a fresh temporary one when empty")
	flag.StringVar(&s.readyFile, "ready-file", "", "write the server description here as JSON once /readyz is ok")
	flag.IntVar(&s.port, "port", 0, "apiserver port on 127.0.0.1 (0: a free one)")
	flag.IntVar(&s.etcdPort, "etcd-port", 0, "etcd client port on 127.0.0.1 (0: a free one)")
	flag.DurationVar(&s.compactionInterval, "compaction-interval", 10*time.Second, "--etcd-compaction-interval")
	flag.IntVar(&s.maxInflight, "max-requests-inflight", 20, "APF budget, read part")
	flag.IntVar(&s.maxMutating, "max-mutating-requests-inflight", 10, "APF budget, mutating part")
	flag.DurationVar(&s.readyTimeout, "ready-timeout", 3*time.Minute, "give up when /readyz is not ok by then")
	flag.IntVar(&s.verbosity, "v", 0, "apiserver log verbosity")
	flag.StringVar(&extra, "apiserver-args", "", "extra kube-apiserver flags, separated by spaces")
	flag.Parse()
	if extra != "" {
		s.extraArgs = strings.Fields(extra)
	}
	if s.readyFile == "" {
		return s, errors.New("-ready-file is required")
	}
	return s, nil
}

func run() error {
	s, err := parseFlags()
	if err != nil {
		return err
	}
	ownDir := s.dir == ""
	if ownDir {
		if s.dir, err = os.MkdirTemp("", "kubetestenv-"); err != nil {
			return err
		}
		defer os.RemoveAll(s.dir)
	}
	if s.dir, err = filepath.Abs(s.dir); err != nil {
		return err
	}
	creds, err := ensureCredentials(filepath.Join(s.dir, "pki"))
	if err != nil {
		return fmt.Errorf("credentials: %w", err)
	}
	if s.port == 0 {
		if s.port, err = freePort(); err != nil {
			return err
		}
	}
	if s.etcdPort == 0 {
		if s.etcdPort, err = freePort(); err != nil {
			return err
		}
	}

	etcd, err := startEtcd(filepath.Join(s.dir, "etcd"), s.etcdPort)
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	defer etcd.Close()
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", s.etcdPort)

	// NewAPIServerCommand owns SIGTERM/SIGINT: its context ends on the first signal, the
	// apiserver shuts down and Execute returns; a second signal exits at once.
	cmd := app.NewAPIServerCommand()
	cmd.SetArgs(apiserverArgs(s, creds, etcdURL))
	served := make(chan error, 1)
	go func() { served <- cmd.Execute() }()

	info := readyInfo{
		URL:        fmt.Sprintf("https://127.0.0.1:%d", s.port),
		CAFile:     creds.caFile,
		Token:      creds.token,
		Kubeconfig: filepath.Join(s.dir, "admin.kubeconfig"),
		PID:        os.Getpid(),
		Dir:        s.dir,
		EtcdURL:    etcdURL,
		Port:       s.port,
		EtcdPort:   s.etcdPort,
	}
	if err := waitReady(info, creds, s.readyTimeout, served); err != nil {
		return err
	}
	if err := writeKubeconfig(info); err != nil {
		return err
	}
	if err := writeJSONAtomically(s.readyFile, info); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "kubetestenv: ready at %s (pid %d)\n", info.URL, info.PID)
	err = <-served
	// The ready file describes a live server; a stale one would let the next run connect to
	// nothing.
	_ = os.Remove(s.readyFile)
	if err != nil {
		return fmt.Errorf("kube-apiserver: %w", err)
	}
	return nil
}

func apiserverArgs(s settings, c credentials, etcdURL string) []string {
	args := []string{
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(s.port),
		"--cert-dir=" + filepath.Join(s.dir, "apiserver-certs"),
		"--tls-cert-file=" + c.serverCert,
		"--tls-private-key-file=" + c.serverKey,
		"--client-ca-file=" + c.caFile,
		"--etcd-servers=" + etcdURL,
		"--etcd-compaction-interval=" + s.compactionInterval.String(),
		"--watch-cache=true",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + c.saKey,
		"--service-account-signing-key-file=" + c.saKey,
		"--service-cluster-ip-range=10.0.0.0/24",
		"--authorization-mode=Node,RBAC",
		"--token-auth-file=" + c.tokenFile,
		"--enable-priority-and-fairness=true",
		"--max-requests-inflight=" + strconv.Itoa(s.maxInflight),
		"--max-mutating-requests-inflight=" + strconv.Itoa(s.maxMutating),
		// No controller-manager runs, so nothing creates the "default" service account that
		// this admission plugin insists on for every pod.
		"--disable-admission-plugins=ServiceAccount",
		// Every lease renewal is an etcd write that moves resourceVersions; tests want quiet.
		"--endpoint-reconciler-type=none",
		"--profiling=false",
		"--v=" + strconv.Itoa(s.verbosity),
	}
	// An extra flag replaces kubetestenv's own of the same name rather than following it:
	// list flags (admission plugins) would otherwise add up, and enabling a plugin that is
	// also disabled is an error.
	replaced := map[string]bool{}
	for _, extra := range s.extraArgs {
		replaced[flagName(extra)] = true
	}
	kept := args[:0]
	for _, arg := range args {
		if !replaced[flagName(arg)] {
			kept = append(kept, arg)
		}
	}
	return append(kept, s.extraArgs...)
}

// flagName is "--name" of "--name=value".
func flagName(arg string) string {
	name, _, _ := strings.Cut(arg, "=")
	return name
}

// waitReady polls /readyz with the admin token until it answers 200 "ok", the apiserver
// command ends, or the timeout passes.
func waitReady(info readyInfo, c credentials, timeout time.Duration, served <-chan error) error {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(c.caPEM) {
		return errors.New("CA certificate does not parse")
	}
	client := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
	}
	defer client.CloseIdleConnections()
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		select {
		case err := <-served:
			return fmt.Errorf("kube-apiserver ended before it was ready: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
		req, err := http.NewRequest(http.MethodGet, info.URL+"/readyz", nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+c.token)
		resp, err := client.Do(req)
		if err != nil {
			last = err.Error()
			continue
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK && strings.TrimSpace(string(body)) == "ok" {
			return nil
		}
		last = fmt.Sprintf("%d %s", resp.StatusCode, body)
	}
	return fmt.Errorf("/readyz not ok after %s; last answer: %s", timeout, last)
}

func startEtcd(dir string, port int) (*embed.Etcd, error) {
	peerPort, err := freePort()
	if err != nil {
		return nil, err
	}
	cfg := embed.NewConfig()
	cfg.Name = "kubetestenv"
	cfg.Dir = dir
	client := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", port)}
	peer := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", peerPort)}
	cfg.ListenClientUrls = []url.URL{client}
	cfg.AdvertiseClientUrls = []url.URL{client}
	cfg.ListenPeerUrls = []url.URL{peer}
	cfg.AdvertisePeerUrls = []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "error"
	// Test data need not survive a power cut; fsync on a shared disk costs seconds per test.
	cfg.UnsafeNoFsync = true
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, err
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case err := <-e.Err():
		e.Close()
		return nil, err
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, errors.New("etcd not ready after 60s")
	}
}

var handedOut = map[int]bool{}

// freePort picks a port that is free now, below the kernel's ephemeral range (32768 and up on
// Linux). Mechanism of the old "address already in use": a port from Listen(":0") is an
// ephemeral one, and between its Close here and etcd's bind a moment later the kernel could
// hand the same port to any outgoing connection on the machine (tests running beside this one
// open thousands). Ports below the range are only ever taken by an explicit bind.
func freePort() (int, error) {
	const low, high = 20000, 32000
	start := low + int(time.Now().UnixNano()%int64(high-low))
	for i := 0; i < high-low; i++ {
		port := low + (start-low+i)%(high-low)
		if handedOut[port] {
			continue // free again, but one of ours: another listener binds it soon
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		l.Close()
		handedOut[port] = true
		return port, nil
	}
	return 0, fmt.Errorf("no free port in %d-%d", low, high)
}

type credentials struct {
	caFile, serverCert, serverKey, saKey, tokenFile string
	caPEM                                           []byte
	token                                           string
}

// ensureCredentials creates the PKI and the admin token once per state directory and reuses
// them afterwards, so a restarted server keeps the identity its clients trust.
func ensureCredentials(dir string) (credentials, error) {
	c := credentials{
		caFile:     filepath.Join(dir, "ca.crt"),
		serverCert: filepath.Join(dir, "apiserver.crt"),
		serverKey:  filepath.Join(dir, "apiserver.key"),
		saKey:      filepath.Join(dir, "sa.key"),
		tokenFile:  filepath.Join(dir, "tokens.csv"),
	}
	tokenOnly := filepath.Join(dir, "admin.token")
	if _, err := os.Stat(tokenOnly); err != nil {
		if err := createCredentials(dir, c, tokenOnly); err != nil {
			return c, err
		}
	}
	var err error
	if c.caPEM, err = os.ReadFile(c.caFile); err != nil {
		return c, err
	}
	tok, err := os.ReadFile(tokenOnly)
	if err != nil {
		return c, err
	}
	c.token = strings.TrimSpace(string(tok))
	return c, nil
}

func createCredentials(dir string, c credentials, tokenOnly string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kubetestenv-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.0.0.1")},
		DNSNames:     []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tokenBytes := make([]byte, 24)
	if _, err := rand.Read(tokenBytes); err != nil {
		return err
	}
	token := hex.EncodeToString(tokenBytes)
	if err := writePEM(c.caFile, "CERTIFICATE", caDER); err != nil {
		return err
	}
	if err := writePEM(c.serverCert, "CERTIFICATE", srvDER); err != nil {
		return err
	}
	if err := writeECKey(c.serverKey, srvKey); err != nil {
		return err
	}
	if err := writeECKey(c.saKey, saKey); err != nil {
		return err
	}
	// token,user,uid,"group,..."; system:masters makes the admin exempt from RBAC and APF.
	line := fmt.Sprintf("%s,kubetestenv-admin,kubetestenv-admin,\"system:masters\"\n", token)
	if err := os.WriteFile(c.tokenFile, []byte(line), 0o600); err != nil {
		return err
	}
	// Written last: its presence says the directory holds a complete set.
	return os.WriteFile(tokenOnly, []byte(token+"\n"), 0o600)
}

func writePEM(path, kind string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600)
}

func writeECKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(path, "EC PRIVATE KEY", der)
}

func writeKubeconfig(info readyInfo) error {
	// JSON is valid YAML, and kubeconfig loaders accept it.
	cfg := map[string]any{
		"apiVersion":      "v1",
		"kind":            "Config",
		"current-context": "kubetestenv",
		"clusters": []any{map[string]any{
			"name":    "kubetestenv",
			"cluster": map[string]any{"server": info.URL, "certificate-authority": info.CAFile},
		}},
		"users": []any{map[string]any{
			"name": "kubetestenv-admin",
			"user": map[string]any{"token": info.Token},
		}},
		"contexts": []any{map[string]any{
			"name":    "kubetestenv",
			"context": map[string]any{"cluster": "kubetestenv", "user": "kubetestenv-admin"},
		}},
	}
	return writeJSONAtomically(info.Kubeconfig, cfg)
}

func writeJSONAtomically(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
