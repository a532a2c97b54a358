// Command libcni-oracle runs a table of network configurations twice with recording fake
// plugins: (a) through libcni itself, as a runtime would, and (b) through cni-guard, the same
// configuration being the guard's delegate and the guard invoked through libcni as a
// one-plugin list. It compares, as normalised JSON, what every plugin received (stdin after
// runtimeConfig injection, the CNI_* environment, prevResult) and what the runtime got back
// (the result, or the error's code, msg and details). Where the guard differs from libcni on
// purpose the table names the difference, and the comparison checks that the difference is
// exactly that. It ends with one line:
//
//	libcni-equivalence cases=N identical=M differ-on-purpose=K
//
// and exits 1, with a readable diff, on any unexpected difference.
//
//	CNI_GUARD_BIN=target/release/cni-guard libcni-oracle -fake PATH_TO_FAKE [-run SUBSTRING] [-v]
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/types/create"
	"github.com/containernetworking/cni/pkg/version"
)

// record is one plugin call as the fake logged it.
type record = map[string]any

// outcome is what the runtime got back from one verb.
type outcome struct {
	Verb   string `json:"verb"`
	Result any    `json:"result,omitempty"`
	Error  any    `json:"error,omitempty"`
}

// run is one side of a case: the calls each verb made, and each verb's outcome.
type run struct {
	Calls    [][]record `json:"calls"` // per verb, in order
	Outcomes []outcome  `json:"outcomes"`
	Log      string     `json:"-"` // the guard's log lines
	Stderr   string     `json:"-"`
}

type env struct {
	work, bin string
	verbose   bool
	syslog    *net.UnixConn // the guard's log socket (CNI_GUARD_SYSLOG)
}

func main() {
	os.Exit(oracle())
}

func oracle() int {
	fake := flag.String("fake", os.Getenv("FAKE_CNI_BIN"), "the fake plugin binary (cmd/fake)")
	only := flag.String("run", "", "only the cases whose name contains this")
	verbose := flag.Bool("v", false, "print every case's calls")
	keep := flag.Bool("keep", false, "keep the work folder")
	flag.Parse()
	guard := os.Getenv("CNI_GUARD_BIN")
	if guard == "" || *fake == "" {
		fmt.Fprintln(os.Stderr, "libcni-oracle: set CNI_GUARD_BIN and -fake (or FAKE_CNI_BIN)")
		return 2
	}
	work, err := os.MkdirTemp("", "libcni-oracle-")
	check(err)
	if *keep {
		fmt.Println("libcni-oracle: work folder", work)
	} else {
		defer os.RemoveAll(work)
	}
	e := &env{work: work, bin: filepath.Join(work, "bin"), verbose: *verbose}
	check(os.MkdirAll(e.bin, 0o755))
	// One CNI_PATH for both sides: the fake under every type the table names, and the guard.
	check(copyFile(guard, filepath.Join(e.bin, "cni-guard")))
	for _, t := range fakeTypes() {
		check(copyFile(*fake, filepath.Join(e.bin, t)))
	}
	// The guard logs one line per invocation to its syslog socket, decision included: the
	// oracle is that socket, to check exec versus child runs.
	sock := filepath.Join(work, "syslog.sock")
	e.syslog, err = net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	check(err)
	defer e.syslog.Close()
	check(os.Setenv("CNI_GUARD_SYSLOG", sock))

	var identical, onPurpose, failed int
	purposeful := map[string][]string{}
	n := 0
	for i, c := range cases() {
		if *only != "" && !strings.Contains(c.Name, *only) {
			continue
		}
		n++
		diffs := e.runCase(i, c)
		switch {
		case len(diffs) > 0:
			failed++
			fmt.Printf("FAIL %s\n", c.Name)
			for _, d := range diffs {
				fmt.Println(indent(d, "    "))
			}
		case c.Expect == sameAsLibcni:
			identical++
			fmt.Printf("ok   %s\n", c.Name)
		default:
			onPurpose++
			fmt.Printf("ok   %s (differs on purpose: %s)\n", c.Name, c.Expect)
			purposeful[c.Expect] = append(purposeful[c.Expect], c.Name)
		}
	}
	fmt.Println("purposeful differences (each checked to be exactly this):")
	kinds := make([]string, 0, len(purposeful))
	for k := range purposeful {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		fmt.Printf("  %s: %s\n    cases: %s\n", k, expectations[k], strings.Join(purposeful[k], ", "))
	}
	if failed > 0 {
		fmt.Printf("libcni-oracle: %d case(s) with an unexpected difference (FAIL above)\n", failed)
	}
	fmt.Printf("libcni-equivalence cases=%d identical=%d differ-on-purpose=%d\n", n, identical, onPurpose)
	if failed > 0 || n == 0 {
		return 1
	}
	return 0
}

// runCase runs both sides and returns the unexpected differences.
func (e *env) runCase(i int, c Case) []string {
	dir := filepath.Join(e.work, fmt.Sprintf("case-%02d", i))
	check(os.MkdirAll(dir, 0o755))
	rt := &libcni.RuntimeConf{
		ContainerID:    fmt.Sprintf("oracle-%02d", i),
		NetNS:          fmt.Sprintf("/var/run/netns/oracle-%02d", i),
		IfName:         "eth0",
		Args:           c.Args,
		CapabilityArgs: c.Caps,
	}
	if c.IfName != "" {
		rt.IfName = c.IfName
	}
	verbs := c.Verbs
	if len(verbs) == 0 {
		verbs = []string{"ADD", "CHECK", "DEL"}
	}
	gv := c.guardVersion()

	// (a) libcni itself.
	var list *libcni.NetworkConfigList
	var err error
	if c.Single {
		var conf *libcni.PluginConfig
		if conf, err = libcni.ConfFromBytes([]byte(c.Conf)); err == nil {
			list, err = libcni.ConfListFromConf(conf)
		}
	} else {
		list, err = libcni.ConfListFromBytes([]byte(c.Conf))
	}
	if err != nil {
		return []string{fmt.Sprintf("the case's configuration does not load in libcni: %v", err)}
	}
	a := e.side(dir, "a", list, rt, verbs, gv)

	// (b) the guard, with the same configuration as its delegate file.
	delegate := filepath.Join(dir, "delegate.conflist")
	if c.Single {
		delegate = filepath.Join(dir, "delegate.conf")
	}
	check(os.WriteFile(delegate, []byte(c.Conf), 0o644))
	caps := map[string]bool{}
	if c.GuardCaps != nil {
		for _, k := range c.GuardCaps {
			caps[k] = true
		}
	} else {
		for _, p := range list.Plugins {
			for k, on := range p.Network.Capabilities {
				if on {
					caps[k] = true
				}
			}
		}
	}
	entry := map[string]any{
		"type":     "cni-guard",
		"delegate": delegate,
		"cacheDir": filepath.Join(dir, "guard-cache"),
	}
	if len(caps) > 0 {
		entry["capabilities"] = caps
	}
	for k, v := range c.GuardExtra {
		entry[k] = v
	}
	guardList := map[string]any{"cniVersion": gv, "name": "guarded", "plugins": []any{entry}}
	raw, err := json.Marshal(guardList)
	check(err)
	glist, err := libcni.ConfListFromBytes(raw)
	check(err)
	b := e.side(dir, "b", glist, rt, verbs, gv)

	total := 0
	for _, step := range a.Calls {
		total += len(step)
	}
	if total == 0 {
		return []string{"libcni called no plugin: the comparison would prove nothing"}
	}
	want, err := expected(c, a)
	if err != nil {
		return []string{err.Error()}
	}
	norm := func(v any) any { return normalise(v, e.work) }
	var diffs []string
	if d := diffJSON("calls", norm(want.Calls), norm(b.Calls)); d != "" {
		diffs = append(diffs, d)
	}
	if d := diffJSON("outcomes", norm(want.Outcomes), norm(b.Outcomes)); d != "" {
		diffs = append(diffs, d)
	}
	// Exec versus child: the guard says which in its log line for ADD.
	if verbs[0] == "ADD" {
		decision := "decision=delegated"
		switch {
		case len(list.Plugins) == 1 && list.CNIVersion == gv:
			decision = "decision=exec"
		case b.Outcomes[0].Error != nil:
			// A failed child run ("refused" for codes 11 and 50): its calls (the rollback)
			// show the children ran.
			decision = "decision=error"
			if strings.Contains(firstLine(b.Log, "verb=ADD"), "decision=refused") {
				decision = "decision=refused"
			}
		}
		if !strings.Contains(firstLine(b.Log, "verb=ADD"), decision) {
			diffs = append(diffs, fmt.Sprintf("the guard's ADD should log %s; its log:\n%s", decision, b.Log))
		}
	}
	if e.verbose || len(diffs) > 0 {
		dump, _ := json.MarshalIndent(map[string]any{"libcni": norm(a), "guard": norm(b)}, "", "  ")
		if e.verbose {
			fmt.Println(string(dump))
		}
		if len(diffs) > 0 {
			diffs = append(diffs, "the guard's log:\n"+b.Log+"plugins' stderr (libcni side, guard side):\n"+a.Stderr+b.Stderr)
		}
	}
	return diffs
}

// side runs the verbs on one list through libcni and reads what the fakes logged.
func (e *env) side(dir, name string, list *libcni.NetworkConfigList, rt *libcni.RuntimeConf, verbs []string, gv string) run {
	logPath := filepath.Join(dir, name+".log")
	check(os.Setenv("FAKE_CNI_LOG", logPath))
	var stderr bytes.Buffer
	exec := &recordingExec{Exec: &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: &stderr}, PluginDecoder: version.PluginDecoder{}}}
	cni := libcni.NewCNIConfigWithCacheDir([]string{e.bin}, filepath.Join(dir, name+"-cache"), exec)
	ctx := context.Background()
	var r run
	seen := 0
	for _, verb := range verbs {
		o := outcome{Verb: verb}
		var err error
		switch verb {
		case "ADD":
			var res types.Result
			res, err = cni.AddNetworkList(ctx, list, rt)
			if err == nil {
				o.Result, err = resultAs(res, gv)
			}
			if err == nil && name == "b" {
				// The guard's reply as it printed it, not only as libcni decoded it: a field
				// libcni's types would drop must not hide there.
				var printed any
				if jerr := json.Unmarshal(exec.lastStdout, &printed); jerr != nil {
					err = fmt.Errorf("the guard's ADD output is not JSON: %v: %q", jerr, exec.lastStdout)
				} else {
					o.Result = printed
				}
			}
		case "CHECK":
			err = cni.CheckNetworkList(ctx, list, rt)
		case "DEL":
			err = cni.DelNetworkList(ctx, list, rt)
		case "STATUS":
			err = cni.GetStatusNetworkList(ctx, list)
		case "GC":
			err = cni.GCNetworkList(ctx, list, &libcni.GCArgs{ValidAttachments: []types.GCAttachment{
				{ContainerID: rt.ContainerID, IfName: rt.IfName}}})
		default:
			panic("unknown verb " + verb)
		}
		if err != nil {
			o.Error = errorJSON(err)
		}
		r.Outcomes = append(r.Outcomes, o)
		all := readLog(logPath)
		r.Calls = append(r.Calls, all[seen:])
		seen = len(all)
		r.Log += e.drainLog()
	}
	r.Stderr = stderr.String()
	return r
}

// recordingExec is libcni's own exec, keeping the last plugin's stdout.
type recordingExec struct {
	invoke.Exec
	lastStdout []byte
}

func (r *recordingExec) ExecPlugin(ctx context.Context, pluginPath string, stdin []byte, environ []string) ([]byte, error) {
	out, err := r.Exec.ExecPlugin(ctx, pluginPath, stdin, environ)
	r.lastStdout = out
	return out, err
}

// drainLog returns the guard's log lines sent since the last call.
func (e *env) drainLog() string {
	var out strings.Builder
	buf := make([]byte, 64*1024)
	for {
		check(e.syslog.SetReadDeadline(time.Now().Add(20 * time.Millisecond)))
		n, err := e.syslog.Read(buf)
		if err != nil {
			return out.String()
		}
		out.Write(buf[:n])
		out.WriteByte('\n')
	}
}

// resultAs is the result as a runtime holding a list at version gv sees it: libcni's own
// conversion to that version, marshalled by libcni's types.
func resultAs(res types.Result, gv string) (any, error) {
	conv, err := res.GetAsVersion(gv)
	if err != nil {
		return nil, fmt.Errorf("libcni cannot convert the result to %s: %w", gv, err)
	}
	raw, err := json.Marshal(conv)
	if err != nil {
		return nil, err
	}
	// Round trip through libcni's decoder, as the runtime's next call would read it.
	back, err := create.CreateFromBytes(raw)
	if err != nil {
		return nil, err
	}
	if raw, err = json.Marshal(back); err != nil {
		return nil, err
	}
	var v any
	return v, json.Unmarshal(raw, &v)
}

// errorJSON is the plugin error inside libcni's wrapping (code, msg, details), or the text of
// an error that is libcni's own.
func errorJSON(err error) any {
	var te *types.Error
	if errors.As(err, &te) {
		m := map[string]any{"code": float64(te.Code), "msg": te.Msg}
		if te.Details != "" {
			m["details"] = te.Details
		}
		return m
	}
	if errors.Is(err, libcni.ErrorCheckNotSupp) {
		return "libcni: " + libcni.ErrorCheckNotSupp.Error()
	}
	return "libcni: " + err.Error()
}

func readLog(path string) []record {
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	check(err)
	var out []record
	for _, line := range bytes.Split(bytes.TrimSpace(raw), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var r record
		check(json.Unmarshal(line, &r))
		out = append(out, r)
	}
	return out
}

// normalise round-trips v through JSON (so maps compare as sorted-key JSON) and replaces the
// work folder in every string.
func normalise(v any, work string) any {
	raw, err := json.Marshal(v)
	check(err)
	var out any
	check(json.Unmarshal(raw, &out))
	var walk func(any) any
	walk = func(v any) any {
		switch t := v.(type) {
		case map[string]any:
			for k, x := range t {
				t[k] = walk(x)
			}
		case []any:
			for i, x := range t {
				t[i] = walk(x)
			}
		case string:
			return strings.ReplaceAll(t, work, "<work>")
		}
		return v
	}
	return walk(out)
}

// diffJSON says how got differs from want, line by line, or "" when they are equal.
func diffJSON(what string, want, got any) string {
	if reflect.DeepEqual(want, got) {
		return ""
	}
	w, _ := json.MarshalIndent(want, "", "  ")
	g, _ := json.MarshalIndent(got, "", "  ")
	return fmt.Sprintf("%s differ (- expected from libcni, + the guard):\n%s", what, lineDiff(string(w), string(g)))
}

// lineDiff is a small LCS diff of two texts.
func lineDiff(a, b string) string {
	x, y := strings.Split(a, "\n"), strings.Split(b, "\n")
	n, m := len(x), len(y)
	lcs := make([][]int, n+1)
	for i := range lcs {
		lcs[i] = make([]int, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if x[i] == y[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var out []string
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && x[i] == y[j]:
			out = append(out, "  "+x[i])
			i++
			j++
		case j < m && (i == n || lcs[i][j+1] >= lcs[i+1][j]):
			out = append(out, "+ "+y[j])
			j++
		default:
			out = append(out, "- "+x[i])
			i++
		}
	}
	return strings.Join(out, "\n")
}

func firstLine(text, containing string) string {
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, containing) {
			return l
		}
	}
	return ""
}

func indent(s, pre string) string {
	return pre + strings.ReplaceAll(s, "\n", "\n"+pre)
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "libcni-oracle:", err)
		os.Exit(2)
	}
}
