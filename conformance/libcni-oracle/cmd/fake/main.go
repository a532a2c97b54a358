// Command fake is the libcni oracle's recording CNI plugin. Installed under several type names,
// it appends one JSON line per call to the file named by $FAKE_CNI_LOG: the verb, its stdin
// parsed as JSON, and every CNI_* variable of its environment. Then it answers as a plugin of
// the cniVersion on its stdin would:
//
//   - ADD prints prevResult (or an empty result) plus one interface named after the plugin's
//     type and one address on it, shaped for the configuration's cniVersion (or for
//     "resultVersion" when the configuration asks for another; "omitResultVersion": true
//     prints it without its cniVersion field);
//   - any other verb prints nothing; VERSION prints the versions this fake supports;
//   - "fail": "ADD" (or a list of verbs) prints a CNI error instead and exits 1, with
//     "failCode" (default 7), "failMsg" and "failDetails".
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/types/create"
)

var supported = []string{"0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}

func main() {
	stdin, err := io.ReadAll(os.Stdin)
	if err != nil {
		die(999, "reading stdin", err.Error(), "1.0.0")
	}
	verb := os.Getenv("CNI_COMMAND")
	var conf map[string]any
	if len(stdin) > 0 {
		if err := json.Unmarshal(stdin, &conf); err != nil {
			logCall(verb, string(stdin))
			die(6, "stdin is not JSON", err.Error(), "1.0.0")
		}
	}
	logCall(verb, conf)

	cniVersion, _ := conf["cniVersion"].(string)
	if cniVersion == "" {
		cniVersion = "0.1.0"
	}
	if fails(conf["fail"], verb) {
		code := 7
		if c, ok := conf["failCode"].(float64); ok {
			code = int(c)
		}
		msg, _ := conf["failMsg"].(string)
		if msg == "" {
			msg = fmt.Sprintf("%s told to fail %s", pluginType(conf), verb)
		}
		details, _ := conf["failDetails"].(string)
		die(uint(code), msg, details, cniVersion)
	}

	switch verb {
	case "VERSION":
		out, _ := json.Marshal(map[string]any{"cniVersion": cniVersion, "supportedVersions": supported})
		fmt.Println(string(out))
	case "ADD":
		if err := add(conf, cniVersion); err != nil {
			die(999, "fake ADD", err.Error(), cniVersion)
		}
	}
}

// add prints prevResult plus this plugin's interface and address.
func add(conf map[string]any, cniVersion string) error {
	res := &types100.Result{CNIVersion: types100.ImplementedSpecVersion}
	if prev, ok := conf["prevResult"]; ok {
		raw, err := json.Marshal(prev)
		if err != nil {
			return err
		}
		parsed, err := create.CreateFromBytes(raw)
		if err != nil {
			return fmt.Errorf("prevResult: %w", err)
		}
		if res, err = types100.GetResult(parsed); err != nil {
			return fmt.Errorf("prevResult: %w", err)
		}
	}
	name := pluginType(conf)
	n := len(res.IPs)
	res.Interfaces = append(res.Interfaces, &types100.Interface{
		Name:    name,
		Mac:     fmt.Sprintf("02:00:00:00:00:%02x", n+1),
		Sandbox: os.Getenv("CNI_NETNS"),
	})
	ip, err := types.ParseCIDR(fmt.Sprintf("10.%d.0.2/24", n+1))
	if err != nil {
		return err
	}
	gw, _ := types.ParseCIDR(fmt.Sprintf("10.%d.0.1/32", n+1))
	res.IPs = append(res.IPs, &types100.IPConfig{
		Interface: types100.Int(len(res.Interfaces) - 1),
		Address:   *ip,
		Gateway:   gw.IP,
	})
	route := &types.Route{Dst: *ip, GW: gw.IP}
	if cniVersion == "1.1.0" {
		// Route fields that only 1.1.0 has: conversions must keep or drop them as libcni does.
		route.MTU = 1400
		route.Table = types100.Int(100 + n)
	}
	res.Routes = append(res.Routes, route)
	if len(res.DNS.Nameservers) == 0 {
		res.DNS.Nameservers = []string{fmt.Sprintf("10.%d.0.53", n+1)}
		res.DNS.Search = []string{name + ".example"}
	}

	outVersion := cniVersion
	if v, ok := conf["resultVersion"].(string); ok {
		outVersion = v
	}
	converted, err := res.GetAsVersion(outVersion)
	if err != nil {
		return err
	}
	raw, err := json.Marshal(converted)
	if err != nil {
		return err
	}
	if omit, _ := conf["omitResultVersion"].(bool); omit {
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			return err
		}
		delete(m, "cniVersion")
		if raw, err = json.Marshal(m); err != nil {
			return err
		}
	}
	_, err = os.Stdout.Write(append(raw, '\n'))
	return err
}

func fails(spec any, verb string) bool {
	switch s := spec.(type) {
	case string:
		return s == verb
	case []any:
		for _, v := range s {
			if v == verb {
				return true
			}
		}
	}
	return false
}

func pluginType(conf map[string]any) string {
	if t, ok := conf["type"].(string); ok && t != "" {
		return t
	}
	return filepath.Base(os.Args[0])
}

// logCall appends one line: {"verb", "argv0", "stdin", "env"}.
func logCall(verb string, stdin any) {
	path := os.Getenv("FAKE_CNI_LOG")
	if path == "" {
		return
	}
	env := map[string]string{}
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "CNI_") {
			env[k] = v
		}
	}
	line, err := json.Marshal(map[string]any{
		"verb":  verb,
		"argv0": filepath.Base(os.Args[0]),
		"stdin": stdin,
		"env":   env,
	})
	if err != nil {
		die(999, "fake: cannot log", err.Error(), "1.0.0")
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		die(999, "fake: cannot open its log", err.Error(), "1.0.0")
	}
	defer f.Close()
	if _, err := f.Write(append(line, '\n')); err != nil {
		die(999, "fake: cannot write its log", err.Error(), "1.0.0")
	}
}

func die(code uint, msg, details, cniVersion string) {
	// The spec's error structure, in the caller's version.
	e := map[string]any{"cniVersion": cniVersion, "code": code, "msg": msg}
	if details != "" {
		e["details"] = details
	}
	out, _ := json.Marshal(e)
	fmt.Println(string(out))
	os.Exit(1)
}
