// Command contender competes for a Lease with client-go's leader election, configured the way
// Linkerd's destination service configures its external workload endpoints controller
// (resourcelock.LeaseLock, ReleaseOnCancel, 30s/10s/2s by default, a new elector after each
// term). It stands in for that controller in the interop tests of external-endpoints.
//
// It writes nothing but a marker: while it leads, an annotation on a ConfigMap in the Lease's
// namespace, rewritten every -marker-interval. Every event is one JSON line on stdout with the
// local time in RFC 3339 with nanoseconds (client-go's own klog lines go to stderr):
//
//	starting          the flags it runs with
//	started leading   OnStartedLeading ran: from now on it may write
//	marker written    a marker write succeeded ("sent" is when the request started)
//	stopped leading   the marker writer has stopped and writes nothing more
//	elector stopped   OnStoppedLeading ran (after the release, if any)
//	new leader        OnNewLeader reported a holder
//	exiting           after SIGTERM/SIGINT, once the elector has returned
//
// On SIGTERM or SIGINT it first stops the marker writer, then cancels the elector, which
// releases the Lease (ReleaseOnCancel, as Linkerd's controller configures it), then exits 0.
// Linkerd's destination process itself exits on SIGTERM before that release is sent, leaving
// the Lease to expire; -release-on-cancel=false reproduces that exit.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// MarkerAnnotation is the ConfigMap annotation the leader rewrites: "<identity> <sequence>".
const MarkerAnnotation = "external-endpoints.test/contender-marker"

type options struct {
	kubeconfig      string
	identity        string
	leaseName       string
	leaseNamespace  string
	leaseDuration   time.Duration
	renewDeadline   time.Duration
	retryPeriod     time.Duration
	markerConfigMap string
	markerInterval  time.Duration
	releaseOnCancel bool
}

// events serialises the JSON lines written to stdout.
type events struct {
	mu       sync.Mutex
	identity string
}

func (e *events) log(event string, fields map[string]any) {
	line := map[string]any{
		"time":     time.Now().UTC().Format(time.RFC3339Nano),
		"identity": e.identity,
		"event":    event,
	}
	for k, v := range fields {
		line[k] = v
	}
	text, err := json.Marshal(line)
	if err != nil {
		text = []byte(fmt.Sprintf(`{"event":"log error","error":%q}`, err.Error()))
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	_, _ = os.Stdout.Write(append(text, '\n'))
}

func main() {
	var o options
	flag.StringVar(&o.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file")
	flag.StringVar(&o.identity, "identity", "", "Lease holder identity (required)")
	flag.StringVar(&o.leaseName, "lease-name", "linkerd-destination-endpoint-write", "Lease name")
	flag.StringVar(&o.leaseNamespace, "lease-namespace", "linkerd", "Lease namespace (the marker ConfigMap lives there too)")
	flag.DurationVar(&o.leaseDuration, "lease-duration", 30*time.Second, "LeaseDuration")
	flag.DurationVar(&o.renewDeadline, "renew-deadline", 10*time.Second, "RenewDeadline")
	flag.DurationVar(&o.retryPeriod, "retry-period", 2*time.Second, "RetryPeriod")
	flag.StringVar(&o.markerConfigMap, "marker-configmap", "contender-marker", "ConfigMap the leader annotates")
	flag.DurationVar(&o.markerInterval, "marker-interval", 250*time.Millisecond, "marker rewrite interval while leading")
	flag.BoolVar(&o.releaseOnCancel, "release-on-cancel", true, "release the Lease on shutdown (Linkerd configures true, but its process exits before the release)")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintf(os.Stderr, "contender: %v\n", err)
		os.Exit(1)
	}
}

func run(o options) error {
	if o.identity == "" {
		return errors.New("-identity is required")
	}
	config, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return fmt.Errorf("loading the kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return fmt.Errorf("building a client: %w", err)
	}
	ev := &events{identity: o.identity}
	ev.log("starting", map[string]any{
		"lease":           o.leaseNamespace + "/" + o.leaseName,
		"leaseDuration":   o.leaseDuration.String(),
		"renewDeadline":   o.renewDeadline.String(),
		"retryPeriod":     o.retryPeriod.String(),
		"releaseOnCancel": o.releaseOnCancel,
		"pid":             os.Getpid(),
	})

	// electorCtx ends the elector (and releases the Lease); writing ends the marker writer
	// first, so nothing is written once the Lease may be someone else's.
	electorCtx, cancelElector := context.WithCancel(context.Background())
	defer cancelElector()
	writing, stopWriting := context.WithCancel(context.Background())
	defer stopWriting()
	writer := newActivity()

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		sig := <-signals
		ev.log("signal", map[string]any{"signal": sig.String()})
		stopWriting()
		writer.waitIdle()
		cancelElector()
	}()

	marker := markerWriter{client: client, o: o, ev: ev}
	lec := leaderelection.LeaderElectionConfig{
		ReleaseOnCancel: o.releaseOnCancel,
		Lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Name: o.leaseName, Namespace: o.leaseNamespace},
			Client:     client.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: o.identity},
		},
		LeaseDuration: o.leaseDuration,
		RenewDeadline: o.renewDeadline,
		RetryPeriod:   o.retryPeriod,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				writer.begin()
				defer writer.end()
				ev.log("started leading", nil)
				marker.run(ctx, writing)
				ev.log("stopped leading", nil)
			},
			OnStoppedLeading: func() {
				ev.log("elector stopped", nil)
			},
			OnNewLeader: func(holder string) {
				ev.log("new leader", map[string]any{"holder": holder})
			},
		},
	}
	// Like Linkerd's controller: a new elector after each term, until shutdown.
	for electorCtx.Err() == nil {
		elector, err := leaderelection.NewLeaderElector(lec)
		if err != nil {
			return fmt.Errorf("invalid leader election settings: %w", err)
		}
		elector.Run(electorCtx)
	}
	writer.waitIdle()
	ev.log("exiting", nil)
	return nil
}

// activity counts running marker writers; waitIdle returns once none runs.
type activity struct {
	mu     sync.Mutex
	active int
	idle   *sync.Cond
}

func newActivity() *activity {
	a := &activity{}
	a.idle = sync.NewCond(&a.mu)
	return a
}

func (a *activity) begin() {
	a.mu.Lock()
	a.active++
	a.mu.Unlock()
}

func (a *activity) end() {
	a.mu.Lock()
	a.active--
	if a.active == 0 {
		a.idle.Broadcast()
	}
	a.mu.Unlock()
}

func (a *activity) waitIdle() {
	a.mu.Lock()
	for a.active > 0 {
		a.idle.Wait()
	}
	a.mu.Unlock()
}

// markerWriter rewrites the marker annotation while a term lasts.
type markerWriter struct {
	client kubernetes.Interface
	o      options
	ev     *events
	seq    int
}

// run writes the marker every interval until the term's context or writing ends.
func (m *markerWriter) run(term, writing context.Context) {
	ctx, cancel := context.WithCancel(term)
	defer cancel()
	go func() {
		select {
		case <-writing.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	ticker := time.NewTicker(m.o.markerInterval)
	defer ticker.Stop()
	for {
		// writing is checked directly: the goroutine above may not have run yet.
		if ctx.Err() != nil || writing.Err() != nil {
			return
		}
		m.seq++
		sent := time.Now().UTC()
		if err := m.write(ctx, m.seq); err != nil {
			if ctx.Err() == nil {
				m.ev.log("marker write failed", map[string]any{"seq": m.seq, "error": err.Error()})
			}
		} else {
			m.ev.log("marker written", map[string]any{
				"seq":  m.seq,
				"sent": sent.Format(time.RFC3339Nano),
			})
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

func (m *markerWriter) write(ctx context.Context, seq int) error {
	maps := m.client.CoreV1().ConfigMaps(m.o.leaseNamespace)
	value := m.o.identity + " " + strconv.Itoa(seq)
	current, err := maps.Get(ctx, m.o.markerConfigMap, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		created := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Name:        m.o.markerConfigMap,
			Namespace:   m.o.leaseNamespace,
			Annotations: map[string]string{MarkerAnnotation: value},
		}}
		_, err = maps.Create(ctx, created, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	if current.Annotations == nil {
		current.Annotations = map[string]string{}
	}
	current.Annotations[MarkerAnnotation] = value
	_, err = maps.Update(ctx, current, metav1.UpdateOptions{})
	return err
}
