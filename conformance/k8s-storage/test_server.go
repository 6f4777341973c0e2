// Package testserver, as compiled into Kubernetes' storage suite by conformance/k8s-storage:
// this file replaces the package's test_server.go through `go test -overlay`, so every test
// that asks for "an etcd" gets a fresh external server process instead of an embedded etcd.
//
// ETCDSQL_SUITE_SERVER names the server (etcdsql or etcd), ETCDSQL_SUITE_BIN its binary. For
// etcdsql, ETCDSQL_SUITE_POSTGRES (a postgres:// URL of a server) selects a fresh PostgreSQL
// database per test instead of a fresh SQLite file. Each server listens on a free loopback
// port, keeps its data in the test's temporary folder, is stopped when the test ends, and its
// log is printed when the test failed.
package testserver

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/kubernetes"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
)

// NewTestConfig returns a configuration whose only use here is to carry the settings a test
// changes (the progress notify interval) to RunEtcd.
func NewTestConfig(t testing.TB) *embed.Config {
	return embed.NewConfig()
}

var (
	portLock sync.Mutex
	started  atomic.Int64
)

// freePorts asks the kernel for n distinct unused loopback ports (all held open until all are
// chosen, so they differ). Another process could take one before the server binds it: RunEtcd
// then starts again on new ones. portLock keeps this suite's own servers from racing.
func freePorts(t testing.TB, n int) []int {
	ports := make([]int, 0, n)
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("no free port: %v", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// serverArgs are the flags that start the selected server on clientPort (etcd: peerPort for its
// peer listener) with its data in dir.
func serverArgs(t testing.TB, server string, cfg *embed.Config, clientPort, peerPort int, dir string) []string {
	client := "http://127.0.0.1:" + strconv.Itoa(clientPort)
	interval := cfg.ExperimentalWatchProgressNotifyInterval
	switch server {
	case "etcd":
		peer := "http://127.0.0.1:" + strconv.Itoa(peerPort)
		args := []string{
			"--name", "default", "--data-dir", filepath.Join(dir, "etcd"),
			"--listen-client-urls", client, "--advertise-client-urls", client,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", "default=" + peer,
			"--unsafe-no-fsync", "--log-level", "error",
		}
		if interval > 0 {
			args = append(args, "--experimental-watch-progress-notify-interval", interval.String())
		}
		return args
	case "etcdsql":
		endpoint := "sqlite://" + filepath.Join(dir, "state.db")
		if pg := os.Getenv("ETCDSQL_SUITE_POSTGRES"); pg != "" {
			// test.sh drops every etcdsql_test_* database after the run.
			name := fmt.Sprintf("etcdsql_test_suite_%d_%d", os.Getpid(), started.Add(1))
			endpoint = pg + "/" + name
		}
		args := []string{
			"--listen-client-urls", client, "--endpoint", endpoint, "--log-level", "warn",
		}
		if interval > 0 {
			args = append(args, "--watch-progress-notify-interval", interval.String())
		}
		return args
	}
	t.Fatalf("ETCDSQL_SUITE_SERVER=%q: expected etcdsql or etcd", server)
	return nil
}

// startServer starts the server in dir/attemptN and waits until it listens; it returns its
// address, or retry=true if it exited because its port was taken (and attempts remain). The
// server is stopped when the test ends.
func startServer(t testing.TB, server, bin string, cfg *embed.Config, dir string, attempt int) (string, bool) {
	const attempts = 3
	dir = filepath.Join(dir, fmt.Sprintf("attempt%d", attempt))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "server.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}

	portLock.Lock()
	defer portLock.Unlock()
	ports := freePorts(t, 2)
	cmd := exec.Command(bin, serverArgs(t, server, cfg, ports[0], ports[1], dir)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	// Closed once the process has exited; waitErr is its status then. Both the wait below and
	// the cleanup read it, so neither can miss the exit.
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		logFile.Close()
		if t.Failed() {
			if log, err := os.ReadFile(logPath); err == nil && len(log) > 0 {
				t.Logf("%s log:\n%s", server, log)
			}
		}
	})
	address := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	deadline := time.Now().Add(60 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", address, time.Second)
		if err == nil {
			conn.Close()
			return address, false
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(logPath)
			if attempt < attempts && strings.Contains(string(log), "address already in use") {
				t.Logf("%s lost its port (attempt %d); starting it again", server, attempt)
				return "", true
			}
			t.Fatalf("%s exited before serving (%v):\n%s", server, waitErr, log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not listen on %s within 60 s", server, address)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// RunEtcd starts a fresh server for this test and returns a client connected to it; the
// server is stopped when the test ends.
func RunEtcd(t testing.TB, cfg *embed.Config) *kubernetes.Client {
	t.Helper()
	server, bin := os.Getenv("ETCDSQL_SUITE_SERVER"), os.Getenv("ETCDSQL_SUITE_BIN")
	if server == "" || bin == "" {
		t.Fatal("set ETCDSQL_SUITE_SERVER (etcdsql or etcd) and ETCDSQL_SUITE_BIN")
	}
	if cfg == nil {
		cfg = NewTestConfig(t)
	}
	dir := t.TempDir()
	var address string
	// A start that finds its port taken (another process got it between freePorts and the
	// server's bind) is tried again on new ports, a few times.
	for attempt := 1; ; attempt++ {
		var retry bool
		address, retry = startServer(t, server, bin, cfg, dir, attempt)
		if !retry {
			break
		}
	}

	endpoint := url.URL{Scheme: "http", Host: address}
	client, err := kubernetes.New(clientv3.Config{
		Endpoints:   []string{endpoint.String()},
		DialTimeout: 10 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithBlock()},
		Logger:      zaptest.NewLogger(t, zaptest.Level(zapcore.ErrorLevel)).Named("etcd-client"),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	client.KV = storagetesting.NewKVRecorder(client.KV)
	client.Kubernetes = storagetesting.NewKubernetesRecorder(client.Kubernetes)
	return client
}
