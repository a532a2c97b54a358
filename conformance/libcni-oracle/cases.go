package main

import (
	"encoding/json"
	"fmt"
	"sort"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types/create"
	"github.com/containernetworking/cni/pkg/version"
)

// Case is one configuration run through libcni and through the guard.
type Case struct {
	Name string
	// Conf is the delegate configuration: a conflist, or with Single a one-plugin .conf.
	Conf   string
	Single bool
	// GuardVersion is the guard conflist's cniVersion (default 1.0.0, what containerd and
	// the guard's installer write).
	GuardVersion string
	// GuardCaps are the capabilities the guard declares; nil: every capability the delegate's
	// plugins declare (what the README tells operators to do).
	GuardCaps []string
	// GuardExtra are further keys of the guard's entry in its conflist.
	GuardExtra map[string]any
	// The runtime's side: CNI_ARGS, capability arguments, interface name, verbs in order
	// (default ADD, CHECK, DEL).
	Args   [][2]string
	Caps   map[string]any
	IfName string
	Verbs  []string
	// Expect names the purposeful difference, or sameAsLibcni.
	Expect string
}

func (c Case) guardVersion() string {
	if c.GuardVersion == "" {
		return "1.0.0"
	}
	return c.GuardVersion
}

// The purposeful differences, each checked to be exactly what it says.
const (
	sameAsLibcni      = ""
	rollback          = "rollback"
	checkBefore040    = "check-skipped-before-0.4.0"
	guardCapabilities = "guard-capabilities"
	guardArgs         = "guard-args"
	resultConverted   = "result-converted"
)

var expectations = map[string]string{
	rollback: "libcni returns a failed ADD's error and runs nothing more; the guard first runs DEL " +
		"on the plugins already run, the failing one included, in reverse (each given the " +
		"configuration libcni would build for it, with the failing plugin's prevResult from 0.4.0 on), " +
		"then returns the same error",
	checkBefore040: "libcni's CheckNetworkList refuses a list before 0.4.0 (\"does not support the CHECK " +
		"command\"); the guard (itself at 0.4.0 or later) answers CHECK with success without running " +
		"the delegate",
	guardCapabilities: "a delegate plugin gets only the capability arguments the guard itself declares " +
		"(the runtime gives the guard no others): runtimeConfig keys the guard does not declare are absent",
	resultConverted: "a plugin that answers ADD in another cniVersion than its configuration's: " +
		"libcni threads that result to the next plugin as it was printed; the guard converts it " +
		"to the list's cniVersion first (with libcni's converters)",
	guardArgs: "the guard's own \"args\" (from the runtime) are merged into every delegate plugin's " +
		"\"args\", key by key at the top level, the guard's keys winning",
}

// expected is what the guard's side must be, derived from libcni's side (a) and the case's
// named difference.
func expected(c Case, a run) (run, error) {
	var w run
	raw, err := json.Marshal(a)
	if err != nil {
		return w, err
	}
	if err := json.Unmarshal(raw, &w); err != nil {
		return w, err
	}
	verbs := c.Verbs
	if len(verbs) == 0 {
		verbs = []string{"ADD", "CHECK", "DEL"}
	}
	switch c.Expect {
	case sameAsLibcni:
	case rollback:
		i := indexOf(verbs, "ADD")
		if i < 0 || w.Outcomes[i].Error == nil || len(w.Calls[i]) == 0 {
			return w, fmt.Errorf("case premise: libcni's ADD should fail after calling plugins")
		}
		calls := w.Calls[i]
		failed := calls[len(calls)-1]
		prev, hasPrev := stdin(failed)["prevResult"]
		for j := len(calls) - 1; j >= 0; j-- {
			del := clone(calls[j])
			del["verb"] = "DEL"
			del["env"].(map[string]any)["CNI_COMMAND"] = "DEL"
			in := stdin(del)
			delete(in, "prevResult")
			v, _ := in["cniVersion"].(string)
			if ge, _ := version.GreaterThanOrEqualTo(v, "0.4.0"); ge && hasPrev {
				in["prevResult"] = prev
			}
			w.Calls[i] = append(w.Calls[i], del)
		}
	case checkBefore040:
		i := indexOf(verbs, "CHECK")
		if i < 0 || w.Outcomes[i].Error != "libcni: "+libcni.ErrorCheckNotSupp.Error() {
			return w, fmt.Errorf("case premise: libcni's CHECK should refuse, got %v", w.Outcomes[i].Error)
		}
		w.Outcomes[i].Error = nil
	case guardCapabilities:
		keep := map[string]bool{}
		for _, k := range c.GuardCaps {
			keep[k] = true
		}
		for _, step := range w.Calls {
			for _, r := range step {
				in := stdin(r)
				rc, ok := in["runtimeConfig"].(map[string]any)
				if !ok {
					continue
				}
				for k := range rc {
					if !keep[k] {
						delete(rc, k)
					}
				}
				if len(rc) == 0 {
					delete(in, "runtimeConfig")
				}
			}
		}
	case guardArgs:
		extra := c.GuardExtra["args"].(map[string]any)
		for _, step := range w.Calls {
			for _, r := range step {
				in := stdin(r)
				merged, _ := in["args"].(map[string]any)
				if merged == nil {
					merged = map[string]any{}
				}
				for k, v := range extra {
					merged[k] = v
				}
				in["args"] = merged
			}
		}
	case resultConverted:
		converted := 0
		for _, step := range w.Calls {
			for _, r := range step {
				in := stdin(r)
				prev, ok := in["prevResult"]
				if !ok {
					continue
				}
				v, _ := in["cniVersion"].(string)
				raw, err := json.Marshal(prev)
				if err != nil {
					return w, err
				}
				res, err := create.CreateFromBytes(raw)
				if err != nil {
					return w, err
				}
				if res.Version() == v {
					continue
				}
				conv, err := res.GetAsVersion(v)
				if err != nil {
					return w, err
				}
				if raw, err = json.Marshal(conv); err != nil {
					return w, err
				}
				var m any
				if err := json.Unmarshal(raw, &m); err != nil {
					return w, err
				}
				in["prevResult"] = m
				converted++
			}
		}
		if converted == 0 {
			return w, fmt.Errorf("case premise: libcni should thread a result of another version")
		}
	default:
		return w, fmt.Errorf("unknown expectation %q", c.Expect)
	}
	return w, nil
}

func stdin(r record) map[string]any {
	m, _ := r["stdin"].(map[string]any)
	return m
}

func clone(r record) record {
	raw, _ := json.Marshal(r)
	var out record
	_ = json.Unmarshal(raw, &out)
	return out
}

func indexOf(list []string, s string) int {
	for i, x := range list {
		if x == s {
			return i
		}
	}
	return -1
}

// --- building the table ------------------------------------------------------------------------

type obj = map[string]any

// plugin is one fake plugin entry of type t with further keys.
func plugin(t string, kv ...any) obj {
	p := obj{"type": t}
	for i := 0; i+1 < len(kv); i += 2 {
		p[kv[i].(string)] = kv[i+1]
	}
	return p
}

// conflist renders a conflist of version v with the given plugins and top-level keys.
func conflist(v string, top obj, plugins ...obj) string {
	l := obj{"cniVersion": v, "name": "delegate-net", "plugins": plugins}
	for k, x := range top {
		l[k] = x
	}
	raw, err := json.Marshal(l)
	if err != nil {
		panic(err)
	}
	return string(raw)
}

// conf renders a one-plugin .conf of version v.
func conf(v string, p obj) string {
	p["cniVersion"] = v
	p["name"] = "delegate-net"
	raw, err := json.Marshal(p)
	if err != nil {
		panic(err)
	}
	return string(raw)
}

func caps(names ...string) obj {
	m := obj{}
	for _, n := range names {
		m[n] = true
	}
	return m
}

var allVersions = []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// Capability arguments as a runtime (containerd's CRI) passes them, plus one nobody declares.
var runtimeCaps = obj{
	"portMappings":                      []any{obj{"hostPort": 8080.0, "containerPort": 80.0, "protocol": "tcp"}},
	"bandwidth":                         obj{"ingressRate": 1000000.0, "ingressBurst": 1000.0, "egressRate": 2000000.0, "egressBurst": 2000.0},
	"ips":                               []any{"10.99.0.5/24"},
	"mac":                               "02:42:ac:11:00:02",
	"io.kubernetes.cri.pod-annotations": obj{"a": "b"},
	"notDeclaredByAnyone":               obj{"x": 1.0},
}

var k8sArgs = [][2]string{{"IgnoreUnknown", "true"}, {"K8S_POD_NAMESPACE", "default"},
	{"K8S_POD_NAME", "web-0"}, {"K8S_POD_INFRA_CONTAINER_ID", "oracle"}}

func cases() []Case {
	var cs []Case
	// Three-plugin chains at every version, under a 1.0.0 guard and a 1.1.0 guard.
	for _, v := range allVersions {
		verbs := []string{"ADD", "CHECK", "DEL"}
		if ge, _ := version.GreaterThanOrEqualTo(v, "0.4.0"); !ge {
			verbs = []string{"ADD", "DEL"}
		}
		for _, gv := range []string{"1.0.0", "1.1.0"} {
			cs = append(cs, Case{
				Name:         fmt.Sprintf("chain3/delegate-%s/guard-%s", v, gv),
				Conf:         conflist(v, nil, plugin("fake-a"), plugin("fake-b"), plugin("fake-c")),
				GuardVersion: gv, Verbs: verbs, Args: k8sArgs,
			})
		}
	}
	// CHECK on lists before 0.4.0.
	for _, v := range []string{"0.3.0", "0.3.1"} {
		cs = append(cs, Case{
			Name:   fmt.Sprintf("check/delegate-%s", v),
			Conf:   conflist(v, nil, plugin("fake-a"), plugin("fake-b")),
			Expect: checkBefore040,
		})
	}
	// One plugin: at the guard's version the guard execs it; at another it runs it as a child.
	cs = append(cs,
		Case{Name: "single/1.0.0-under-1.0.0 (exec)", Conf: conflist("1.0.0", nil, plugin("fake-a"))},
		Case{Name: "single/1.1.0-under-1.1.0 (exec)", Conf: conflist("1.1.0", nil, plugin("fake-a")), GuardVersion: "1.1.0"},
		Case{Name: "single/0.4.0-under-0.4.0 (exec)", Conf: conflist("0.4.0", nil, plugin("fake-a")), GuardVersion: "0.4.0"},
		Case{Name: "single/0.4.0-under-1.0.0 (child)", Conf: conflist("0.4.0", nil, plugin("fake-a"))},
		Case{Name: "single/1.1.0-under-1.0.0 (child)", Conf: conflist("1.1.0", nil, plugin("fake-a"))},
		Case{Name: "single/1.0.0-under-1.1.0 (child)", Conf: conflist("1.0.0", nil, plugin("fake-a")), GuardVersion: "1.1.0"},
		Case{Name: "single/0.3.1-under-1.0.0 (child)", Conf: conflist("0.3.1", nil, plugin("fake-a")), Verbs: []string{"ADD", "DEL"}},
		Case{Name: "single-conf/1.0.0 .conf (exec)", Conf: conf("1.0.0", plugin("fake-a")), Single: true},
		Case{Name: "single-conf/0.4.0 .conf (child)", Conf: conf("0.4.0", plugin("fake-a")), Single: true},
		Case{Name: "single-conf/1.1.0 .conf with capabilities (exec)", Single: true, GuardVersion: "1.1.0",
			Conf: conf("1.1.0", plugin("fake-a", "capabilities", caps("portMappings", "mac"))), Caps: runtimeCaps, Args: k8sArgs},
	)
	// Capabilities and runtimeConfig.
	capChain := func(v string) string {
		return conflist(v, nil,
			plugin("fake-a", "capabilities", caps("ips", "mac")),
			plugin("fake-portmap", "capabilities", caps("portMappings")),
			plugin("fake-bandwidth", "capabilities", caps("bandwidth", "io.kubernetes.cri.pod-annotations")))
	}
	for _, v := range []string{"0.4.0", "1.0.0", "1.1.0"} {
		cs = append(cs, Case{Name: "capabilities/chain-" + v, Conf: capChain(v), Caps: runtimeCaps, Args: k8sArgs})
	}
	cs = append(cs,
		Case{Name: "capabilities/only-undeclared-arguments", Conf: capChain("1.0.0"),
			Caps: obj{"notDeclaredByAnyone": true, "dns": obj{"servers": []any{"1.1.1.1"}}}},
		Case{Name: "capabilities/declared-false", Caps: runtimeCaps,
			Conf: conflist("1.0.0", nil,
				plugin("fake-a", "capabilities", obj{"portMappings": false, "mac": true}),
				plugin("fake-b", "capabilities", obj{"bandwidth": false}))},
		Case{Name: "capabilities/static-runtimeConfig", Caps: runtimeCaps,
			Conf: conflist("1.0.0", nil,
				plugin("fake-a", "capabilities", caps("portMappings"), "runtimeConfig", obj{"static": 1.0}),
				plugin("fake-b", "runtimeConfig", obj{"static": 2.0}))},
		Case{Name: "capabilities/single-exec-1.0.0", Caps: runtimeCaps,
			Conf: conflist("1.0.0", nil, plugin("fake-portmap", "capabilities", caps("portMappings", "bandwidth")))},
		Case{Name: "capabilities/guard-declares-fewer", Conf: capChain("1.0.0"), Caps: runtimeCaps,
			GuardCaps: []string{"portMappings", "mac"}, Expect: guardCapabilities},
	)
	// CNI_ARGS and the plugins' own args.
	cs = append(cs,
		Case{Name: "cni-args/chain", Conf: conflist("1.0.0", nil, plugin("fake-a"), plugin("fake-b")),
			Args: [][2]string{{"IgnoreUnknown", "1"}, {"IP", "10.5.0.9"}, {"MAC", "02:00:00:00:00:99"}}},
		Case{Name: "cni-args/single-exec", Conf: conflist("1.0.0", nil, plugin("fake-a")), Args: k8sArgs, IfName: "net1"},
		Case{Name: "plugin-args/own-args", Args: k8sArgs,
			Conf: conflist("1.0.0", nil,
				plugin("fake-a", "args", obj{"cni": obj{"ips": []any{"10.9.0.5/24"}}}),
				plugin("fake-b", "args", obj{"custom": obj{"k": "v"}}))},
		Case{Name: "plugin-args/guard-has-args", Args: k8sArgs,
			GuardExtra: map[string]any{"args": obj{"cni": obj{"labels": []any{obj{"key": "app", "value": "web"}}}}},
			Conf: conflist("1.0.0", nil,
				plugin("fake-a", "args", obj{"custom": obj{"k": "v"}}),
				plugin("fake-b")),
			Expect: guardArgs},
	)
	// Failures.
	cs = append(cs,
		Case{Name: "fail/mid-chain-1.0.0", Verbs: []string{"ADD", "DEL"}, Args: k8sArgs, Caps: runtimeCaps,
			Conf:   conflist("1.0.0", nil, plugin("fake-a", "capabilities", caps("mac")), plugin("fake-b", "fail", "ADD"), plugin("fake-c")),
			Expect: rollback},
		Case{Name: "fail/mid-chain-0.4.0", Verbs: []string{"ADD", "DEL"},
			Conf:   conflist("0.4.0", nil, plugin("fake-a"), plugin("fake-b", "fail", "ADD", "failCode", 11.0, "failMsg", "not yet"), plugin("fake-c")),
			Expect: rollback},
		Case{Name: "fail/mid-chain-0.3.1", Verbs: []string{"ADD", "DEL"},
			Conf:   conflist("0.3.1", nil, plugin("fake-a"), plugin("fake-b", "fail", "ADD"), plugin("fake-c")),
			Expect: rollback},
		Case{Name: "fail/first-plugin-1.1.0", Verbs: []string{"ADD", "DEL"}, GuardVersion: "1.1.0",
			Conf:   conflist("1.1.0", nil, plugin("fake-a", "fail", "ADD", "failCode", 42.0, "failMsg", "custom", "failDetails", "some details"), plugin("fake-b")),
			Expect: rollback},
		Case{Name: "fail/last-plugin-1.0.0", Verbs: []string{"ADD", "DEL"},
			Conf:   conflist("1.0.0", nil, plugin("fake-a"), plugin("fake-b"), plugin("fake-c", "fail", "ADD")),
			Expect: rollback},
		Case{Name: "fail/single-exec-no-rollback", Verbs: []string{"ADD", "DEL"},
			Conf: conflist("1.0.0", nil, plugin("fake-a", "fail", "ADD", "failCode", 7.0, "failMsg", "bad config"))},
		Case{Name: "fail/del-mid-chain", Conf: conflist("1.0.0", nil, plugin("fake-a"), plugin("fake-b", "fail", "DEL"), plugin("fake-c"))},
		Case{Name: "fail/check-mid-chain", Conf: conflist("1.0.0", nil, plugin("fake-a"), plugin("fake-b", "fail", "CHECK", "failCode", 100.0), plugin("fake-c"))},
	)
	// CHECK switches.
	cs = append(cs,
		Case{Name: "check/disableCheck-true", Conf: conflist("1.0.0", obj{"disableCheck": true}, plugin("fake-a"), plugin("fake-b"))},
		Case{Name: "check/disableCheck-string", Conf: conflist("1.0.0", obj{"disableCheck": "true"}, plugin("fake-a"), plugin("fake-b"))},
		Case{Name: "check/disableCheck-single-exec", Conf: conflist("1.0.0", obj{"disableCheck": true}, plugin("fake-a"))},
		Case{Name: "check/disableCheck-false", Conf: conflist("1.0.0", obj{"disableCheck": false}, plugin("fake-a"), plugin("fake-b"))},
	)
	// Versions inside one list.
	cs = append(cs,
		Case{Name: "versions/plugins-declare-their-own", Args: k8sArgs,
			Conf: conflist("1.0.0", nil, plugin("fake-a", "cniVersion", "0.3.1"), plugin("fake-b", "cniVersion", "1.1.0"), plugin("fake-c"))},
		Case{Name: "versions/cniVersions-picks-newest", GuardVersion: "1.1.0",
			Conf: conflist("0.4.0", obj{"cniVersions": []any{"0.4.0", "1.0.0", "1.1.0"}}, plugin("fake-a"), plugin("fake-b"))},
		Case{Name: "versions/cniVersions-single-exec", GuardVersion: "1.1.0",
			Conf: conflist("1.0.0", obj{"cniVersions": []any{"1.0.0", "1.1.0"}}, plugin("fake-a"))},
		Case{Name: "versions/result-without-cniVersion",
			Conf: conflist("1.0.0", nil, plugin("fake-a", "omitResultVersion", true), plugin("fake-b"))},
		Case{Name: "versions/plugin-answers-another-version",
			Conf:   conflist("1.0.0", nil, plugin("fake-a", "resultVersion", "0.4.0"), plugin("fake-b")),
			Expect: resultConverted},
	)
	// DEL without an ADD before it (a runtime cleaning up): no cached result, no record.
	cs = append(cs,
		Case{Name: "del/without-add-1.0.0", Verbs: []string{"DEL"}, Args: k8sArgs, Caps: runtimeCaps,
			Conf: conflist("1.0.0", nil, plugin("fake-a", "capabilities", caps("portMappings")), plugin("fake-b"))},
		Case{Name: "del/without-add-single-0.4.0", Verbs: []string{"DEL", "DEL"},
			Conf: conflist("0.4.0", nil, plugin("fake-a"))},
	)
	// STATUS and GC (1.1.0).
	cs = append(cs,
		Case{Name: "status-gc/delegate-1.0.0-under-guard-1.1.0", GuardVersion: "1.1.0", Verbs: []string{"ADD", "STATUS", "GC", "DEL"},
			Conf: conflist("1.0.0", nil, plugin("fake-a"), plugin("fake-b"))},
		Case{Name: "status-gc/chain-1.1.0", GuardVersion: "1.1.0", Verbs: []string{"ADD", "STATUS", "GC", "DEL"},
			Conf: conflist("1.1.0", nil, plugin("fake-a"), plugin("fake-b"))},
		Case{Name: "status-gc/disableGC-true", GuardVersion: "1.1.0", Verbs: []string{"ADD", "GC", "DEL"},
			Conf: conflist("1.1.0", obj{"disableGC": true}, plugin("fake-a"), plugin("fake-b"))},
		Case{Name: "status-gc/disableGC-string", GuardVersion: "1.1.0", Verbs: []string{"ADD", "GC", "DEL"},
			Conf: conflist("1.1.0", obj{"disableGC": "True"}, plugin("fake-a"), plugin("fake-b"))},
		Case{Name: "status-gc/single-exec-1.1.0", GuardVersion: "1.1.0", Verbs: []string{"ADD", "STATUS", "CHECK", "GC", "DEL"},
			Conf: conflist("1.1.0", nil, plugin("fake-a"))},
	)
	return cs
}

// fakeTypes are the plugin types the table names: the fake is installed under each.
func fakeTypes() []string {
	seen := map[string]bool{}
	for _, c := range cases() {
		var m map[string]any
		if err := json.Unmarshal([]byte(c.Conf), &m); err != nil {
			panic(err)
		}
		if t, ok := m["type"].(string); ok {
			seen[t] = true
		}
		ps, _ := m["plugins"].([]any)
		for _, p := range ps {
			if t, ok := p.(map[string]any)["type"].(string); ok {
				seen[t] = true
			}
		}
	}
	var out []string
	for t := range seen {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}
