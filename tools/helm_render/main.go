// helm_render renders a Helm chart the way `helm template` does, and checks
// the objects it renders, with no cluster and no helm binary (neither is
// available offline on the machines dpproxy is built on). It uses the
// template engine and function library Helm itself uses (Go's text/template
// and sprig) plus Helm's own functions (include, tpl, required, toYaml,
// fromYaml, toJson, fromJson, lookup), Helm's values merging (values.yaml,
// then each --values file; maps merge, a null removes a key) and Helm's
// built-in objects (.Values, .Release, .Chart, .Capabilities, .Template).
//
// --check then validates every rendered object against a schema of the
// fields dpproxy's chart sets: required fields, known keys (a misspelt key
// is an error, as the API server's strict field validation makes it),
// names that are DNS labels or subdomains, label values, resource
// quantities, ports, and the references between fields and objects (a
// volume mount names a volume, a probe names a container port, a config map
// or service account a pod uses is rendered, a selector matches the pod's
// labels, a role binding names a rendered role).
//
// The merged values are first checked against the chart's
// values.schema.json (JSON Schema, with the library Helm uses).
//
// Build (GOPATH mode, with Debian's golang-go,
// golang-github-masterminds-sprig-dev, golang-github-xeipuuv-gojsonschema-dev
// and golang-gopkg-yaml.v3-dev):
//
//	GOPATH=/usr/share/gocode GO111MODULE=off go build -o helm_render tools/helm_render/main.go
//
// Use:
//
//	helm_render [--values FILE]... [--release NAME] [--namespace NS] [--check] CHART_DIR
//	helm_render ... --data ConfigMap/NAME/KEY CHART_DIR   (prints one data entry)
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/Masterminds/semver"
	"github.com/Masterminds/sprig"
	"github.com/xeipuuv/gojsonschema"
	"gopkg.in/yaml.v3"
)

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "helm_render: "+format+"\n", args...)
	os.Exit(1)
}

// --- Values --------------------------------------------------------------------

func readYAMLMap(path string) (map[string]interface{}, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]interface{}{}
	if err := yaml.Unmarshal(data, &out); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	if out == nil {
		out = map[string]interface{}{}
	}
	return out, nil
}

// mergeValues merges src over dst as Helm does: maps merge key by key, any
// other value replaces, and a null in src removes the key.
func mergeValues(dst, src map[string]interface{}) map[string]interface{} {
	for k, v := range src {
		if v == nil {
			delete(dst, k)
			continue
		}
		sm, sok := v.(map[string]interface{})
		dm, dok := dst[k].(map[string]interface{})
		if sok && dok {
			dst[k] = mergeValues(dm, sm)
		} else {
			dst[k] = v
		}
	}
	return dst
}

// --- Rendering -----------------------------------------------------------------

// toYAML is Helm's toYaml: block style, two-space indent, no trailing newline.
// validateValues checks the merged values against the chart's
// values.schema.json, if it has one, as Helm does before it renders: every
// violation is listed, in Helm's words.
func validateValues(chartDir string, values map[string]interface{}) error {
	schema, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	// Through JSON, as Helm does: YAML's maps and numbers become JSON's.
	doc, err := json.Marshal(values)
	if err != nil {
		return fmt.Errorf("values: %v", err)
	}
	result, err := gojsonschema.Validate(gojsonschema.NewBytesLoader(schema),
		gojsonschema.NewBytesLoader(doc))
	if err != nil {
		return fmt.Errorf("%s: %v", filepath.Join(chartDir, "values.schema.json"), err)
	}
	if result.Valid() {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "values don't meet the specifications of the schema(s) in the following chart(s):\n%s:\n",
		filepath.Base(filepath.Clean(chartDir)))
	for _, e := range result.Errors() {
		fmt.Fprintf(&b, "- %s\n", e)
	}
	return errors.New(strings.TrimSuffix(b.String(), "\n"))
}

func toYAML(v interface{}) string {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(v); err != nil {
		return ""
	}
	return strings.TrimSuffix(buf.String(), "\n")
}

func render(chartDir string, values map[string]interface{}, release, namespace string) (map[string]string, error) {
	chart, err := readYAMLMap(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		return nil, err
	}
	if chart["apiVersion"] != "v2" {
		return nil, fmt.Errorf("Chart.yaml: apiVersion must be v2, not %v", chart["apiVersion"])
	}
	name, _ := chart["name"].(string)
	version, _ := chart["version"].(string)
	if name == "" || version == "" {
		return nil, errors.New("Chart.yaml: name and version are required")
	}
	if _, err := semver.StrictNewVersion(version); err != nil {
		return nil, fmt.Errorf("Chart.yaml: version %q is not SemVer 2: %v", version, err)
	}
	appVersion, _ := chart["appVersion"].(string)
	top := map[string]interface{}{
		"Values": values,
		"Release": map[string]interface{}{
			"Name": release, "Namespace": namespace, "Service": "Helm",
			"IsInstall": true, "IsUpgrade": false, "Revision": 1,
		},
		"Chart": map[string]interface{}{
			"Name": name, "Version": version, "AppVersion": appVersion,
			"Description": chart["description"], "Type": chart["type"],
		},
		"Capabilities": map[string]interface{}{
			"KubeVersion": map[string]interface{}{"Version": "v1.34.0", "Major": "1", "Minor": "34"},
		},
	}

	root := template.New("gotpl")
	funcs := sprig.TxtFuncMap()
	// Helm leaves these out: a chart must not read the renderer's environment.
	delete(funcs, "env")
	delete(funcs, "expandenv")
	includeDepth := 0
	funcs["include"] = func(name string, data interface{}) (string, error) {
		includeDepth++
		defer func() { includeDepth-- }()
		if includeDepth > 1000 {
			return "", fmt.Errorf("include %q: recursion too deep", name)
		}
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, name, data); err != nil {
			return "", err
		}
		return buf.String(), nil
	}
	funcs["tpl"] = func(text string, data interface{}) (string, error) {
		t, err := root.Clone()
		if err != nil {
			return "", err
		}
		t, err = t.New("tpl").Parse(text)
		if err != nil {
			return "", err
		}
		var buf bytes.Buffer
		err = t.Execute(&buf, data)
		return buf.String(), err
	}
	funcs["required"] = func(msg string, v interface{}) (interface{}, error) {
		if v == nil {
			return nil, errors.New(msg)
		}
		if s, ok := v.(string); ok && s == "" {
			return nil, errors.New(msg)
		}
		return v, nil
	}
	funcs["toYaml"] = toYAML
	funcs["fromYaml"] = func(s string) map[string]interface{} {
		m := map[string]interface{}{}
		if err := yaml.Unmarshal([]byte(s), &m); err != nil {
			m["Error"] = err.Error()
		}
		return m
	}
	funcs["fromJson"] = func(s string) map[string]interface{} {
		m := map[string]interface{}{}
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			m["Error"] = err.Error()
		}
		return m
	}
	// No cluster: lookup finds nothing, as in `helm template`.
	funcs["lookup"] = func(string, string, string, string) map[string]interface{} {
		return map[string]interface{}{}
	}
	root.Funcs(funcs).Option("missingkey=zero")

	dir := filepath.Join(chartDir, "templates")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var files []string
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		f := e.Name()
		text, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return nil, err
		}
		tname := name + "/templates/" + f
		if _, err := root.New(tname).Parse(string(text)); err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	sort.Strings(files)
	out := map[string]string{}
	for _, f := range files {
		if strings.HasPrefix(f, "_") {
			continue // partials: only included
		}
		tname := name + "/templates/" + f
		top["Template"] = map[string]interface{}{"Name": tname, "BasePath": name + "/templates"}
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, tname, top); err != nil {
			return nil, err
		}
		out["templates/"+f] = strings.ReplaceAll(buf.String(), "<no value>", "")
	}
	return out, nil
}

// --- Objects -------------------------------------------------------------------

type object struct {
	source string
	doc    map[string]interface{}
}

func (o object) kind() string { s, _ := o.doc["kind"].(string); return s }
func (o object) name() string {
	m, _ := o.doc["metadata"].(map[string]interface{})
	s, _ := m["name"].(string)
	return s
}

func splitObjects(rendered map[string]string) ([]object, error) {
	var files []string
	for f := range rendered {
		files = append(files, f)
	}
	sort.Strings(files)
	var objs []object
	for _, f := range files {
		if strings.HasSuffix(f, ".txt") {
			continue // NOTES.txt
		}
		dec := yaml.NewDecoder(strings.NewReader(rendered[f]))
		for {
			var doc map[string]interface{}
			err := dec.Decode(&doc)
			if err != nil {
				if err.Error() == "EOF" {
					break
				}
				return nil, fmt.Errorf("%s: the rendered text is not YAML: %v", f, err)
			}
			if doc == nil {
				continue
			}
			objs = append(objs, object{f, doc})
		}
	}
	return objs, nil
}

// --- The schema of what the chart sets -------------------------------------------

var (
	dnsLabel     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	labelValue   = regexp.MustCompile(`^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$`)
	quantity     = regexp.MustCompile(`^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$`)
	duration     = regexp.MustCompile(`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`)
)

type checker struct {
	errs []string
	objs []object
}

func (c *checker) errorf(o object, path, format string, args ...interface{}) {
	c.errs = append(c.errs, fmt.Sprintf("%s: %s %s: %s: %s", o.source, o.kind(), o.name(), path,
		fmt.Sprintf(format, args...)))
}

func (c *checker) has(kind, name string) bool {
	for _, o := range c.objs {
		if o.kind() == kind && o.name() == name {
			return true
		}
	}
	return false
}

func asMap(v interface{}) map[string]interface{} { m, _ := v.(map[string]interface{}); return m }
func asList(v interface{}) []interface{}          { l, _ := v.([]interface{}); return l }
func asString(v interface{}) string               { s, _ := v.(string); return s }

// keys reports a key of m that the schema does not know.
func (c *checker) keys(o object, path string, m map[string]interface{}, allowed ...string) {
	for k := range m {
		found := false
		for _, a := range allowed {
			if a == k {
				found = true
				break
			}
		}
		if !found {
			c.errorf(o, path, "unknown field %q", k)
		}
	}
}

func (c *checker) labels(o object, path string, m map[string]interface{}) {
	for k, v := range m {
		s, ok := v.(string)
		if !ok {
			c.errorf(o, path+"."+k, "a label value must be a string, not %T", v)
			continue
		}
		if len(s) > 63 || !labelValue.MatchString(s) {
			c.errorf(o, path+"."+k, "invalid label value %q", s)
		}
	}
}

func (c *checker) metadata(o object, namespaced bool) {
	m := asMap(o.doc["metadata"])
	if m == nil {
		c.errorf(o, "metadata", "required")
		return
	}
	c.keys(o, "metadata", m, "name", "namespace", "labels", "annotations")
	name := asString(m["name"])
	if len(name) > 253 || !dnsSubdomain.MatchString(name) {
		c.errorf(o, "metadata.name", "%q is not a DNS subdomain", name)
	}
	if namespaced && !dnsLabel.MatchString(asString(m["namespace"])) {
		c.errorf(o, "metadata.namespace", "%q is not a namespace name", m["namespace"])
	}
	if !namespaced && m["namespace"] != nil {
		c.errorf(o, "metadata.namespace", "a cluster-scoped object has none")
	}
	c.labels(o, "metadata.labels", asMap(m["labels"]))
}

func (c *checker) port(o object, path string, v interface{}) {
	n, ok := v.(int)
	if !ok || n < 1 || n > 65535 {
		c.errorf(o, path, "%v is not a port number", v)
	}
}

func (c *checker) resources(o object, path string, r map[string]interface{}) {
	c.keys(o, path, r, "requests", "limits")
	for _, part := range []string{"requests", "limits"} {
		for k, v := range asMap(r[part]) {
			if k != "cpu" && k != "memory" && k != "ephemeral-storage" {
				c.errorf(o, path+"."+part+"."+k, "not a resource dpproxy uses")
			}
			if !quantity.MatchString(fmt.Sprint(v)) {
				c.errorf(o, path+"."+part+"."+k, "%q is not a quantity", fmt.Sprint(v))
			}
		}
	}
}

func (c *checker) podSpec(o object, path string, spec map[string]interface{}) {
	c.keys(o, path, spec, "serviceAccountName", "priorityClassName", "imagePullSecrets",
		"tolerations", "nodeSelector", "affinity", "terminationGracePeriodSeconds",
		"containers", "volumes")
	volumes := map[string]bool{}
	for i, v := range asList(spec["volumes"]) {
		p := fmt.Sprintf("%s.volumes[%d]", path, i)
		vm := asMap(v)
		c.keys(o, p, vm, "name", "hostPath", "configMap")
		volumes[asString(vm["name"])] = true
		if hp := asMap(vm["hostPath"]); hp != nil {
			c.keys(o, p+".hostPath", hp, "path", "type")
			if !strings.HasPrefix(asString(hp["path"]), "/") {
				c.errorf(o, p+".hostPath.path", "%q is not an absolute path", hp["path"])
			}
			switch asString(hp["type"]) {
			case "", "Directory", "DirectoryOrCreate", "File", "FileOrCreate", "Socket":
			default:
				c.errorf(o, p+".hostPath.type", "unknown type %q", hp["type"])
			}
		} else if cm := asMap(vm["configMap"]); cm != nil {
			if !c.has("ConfigMap", asString(cm["name"])) {
				c.errorf(o, p+".configMap.name", "no ConfigMap %q is rendered", cm["name"])
			}
		} else {
			c.errorf(o, p, "neither hostPath nor configMap")
		}
	}
	if sa := asString(spec["serviceAccountName"]); sa != "" && sa != "default" &&
		!c.has("ServiceAccount", sa) {
		c.errorf(o, path+".serviceAccountName", "no ServiceAccount %q is rendered", sa)
	}
	for i, t := range asList(spec["tolerations"]) {
		p := fmt.Sprintf("%s.tolerations[%d]", path, i)
		tm := asMap(t)
		c.keys(o, p, tm, "key", "operator", "value", "effect", "tolerationSeconds")
		switch asString(tm["operator"]) {
		case "", "Equal", "Exists":
		default:
			c.errorf(o, p+".operator", "%q is not Equal or Exists", tm["operator"])
		}
		switch asString(tm["effect"]) {
		case "", "NoSchedule", "PreferNoSchedule", "NoExecute":
		default:
			c.errorf(o, p+".effect", "unknown effect %q", tm["effect"])
		}
	}
	containers := asList(spec["containers"])
	if len(containers) == 0 {
		c.errorf(o, path+".containers", "at least one container is required")
	}
	for i, ct := range containers {
		p := fmt.Sprintf("%s.containers[%d]", path, i)
		cm := asMap(ct)
		c.keys(o, p, cm, "name", "image", "imagePullPolicy", "command", "args", "env", "ports",
			"livenessProbe", "readinessProbe", "resources", "securityContext", "volumeMounts")
		if !dnsLabel.MatchString(asString(cm["name"])) {
			c.errorf(o, p+".name", "%q is not a DNS label", cm["name"])
		}
		image := asString(cm["image"])
		if image == "" || strings.HasSuffix(image, ":") || strings.ContainsAny(image, " \t") {
			c.errorf(o, p+".image", "%q is not an image reference", image)
		}
		switch asString(cm["imagePullPolicy"]) {
		case "", "Always", "IfNotPresent", "Never":
		default:
			c.errorf(o, p+".imagePullPolicy", "unknown policy %q", cm["imagePullPolicy"])
		}
		for j, a := range asList(cm["args"]) {
			if _, ok := a.(string); !ok {
				c.errorf(o, fmt.Sprintf("%s.args[%d]", p, j), "must be a string, not %T", a)
			}
		}
		ports := map[string]bool{}
		for j, pt := range asList(cm["ports"]) {
			pp := fmt.Sprintf("%s.ports[%d]", p, j)
			pm := asMap(pt)
			c.keys(o, pp, pm, "name", "containerPort", "protocol")
			c.port(o, pp+".containerPort", pm["containerPort"])
			n := asString(pm["name"])
			if len(n) > 15 || !dnsLabel.MatchString(n) {
				c.errorf(o, pp+".name", "%q is not a port name (a DNS label of at most 15)", n)
			}
			ports[n] = true
		}
		for _, probe := range []string{"livenessProbe", "readinessProbe"} {
			pr := asMap(cm[probe])
			if pr == nil {
				continue
			}
			c.keys(o, p+"."+probe, pr, "httpGet", "periodSeconds", "failureThreshold",
				"initialDelaySeconds", "timeoutSeconds")
			hg := asMap(pr["httpGet"])
			c.keys(o, p+"."+probe+".httpGet", hg, "path", "port")
			if !strings.HasPrefix(asString(hg["path"]), "/") {
				c.errorf(o, p+"."+probe+".httpGet.path", "%q is not a path", hg["path"])
			}
			if pn, ok := hg["port"].(string); ok && !ports[pn] {
				c.errorf(o, p+"."+probe+".httpGet.port", "no container port named %q", pn)
			}
		}
		if r := asMap(cm["resources"]); r != nil {
			c.resources(o, p+".resources", r)
		}
		for j, e := range asList(cm["env"]) {
			em := asMap(e)
			c.keys(o, fmt.Sprintf("%s.env[%d]", p, j), em, "name", "value", "valueFrom")
		}
		mounted := map[string]bool{}
		for j, vm := range asList(cm["volumeMounts"]) {
			pp := fmt.Sprintf("%s.volumeMounts[%d]", p, j)
			m := asMap(vm)
			c.keys(o, pp, m, "name", "mountPath", "readOnly")
			if !volumes[asString(m["name"])] {
				c.errorf(o, pp+".name", "no volume named %q", m["name"])
			}
			mp := asString(m["mountPath"])
			if !strings.HasPrefix(mp, "/") {
				c.errorf(o, pp+".mountPath", "%q is not an absolute path", mp)
			}
			if mounted[mp] {
				c.errorf(o, pp+".mountPath", "%q is mounted twice", mp)
			}
			mounted[mp] = true
		}
	}
}

func (c *checker) daemonSet(o object) {
	c.keys(o, "", o.doc, "apiVersion", "kind", "metadata", "spec")
	if o.doc["apiVersion"] != "apps/v1" {
		c.errorf(o, "apiVersion", "a DaemonSet is apps/v1")
	}
	spec := asMap(o.doc["spec"])
	c.keys(o, "spec", spec, "selector", "updateStrategy", "template")
	selector := asMap(asMap(spec["selector"])["matchLabels"])
	if len(selector) == 0 {
		c.errorf(o, "spec.selector.matchLabels", "required")
	}
	tmpl := asMap(spec["template"])
	podLabels := asMap(asMap(tmpl["metadata"])["labels"])
	c.labels(o, "spec.template.metadata.labels", podLabels)
	for k, v := range selector {
		if podLabels[k] != v {
			c.errorf(o, "spec.selector.matchLabels."+k, "the pod template's labels do not match")
		}
	}
	if us := asMap(spec["updateStrategy"]); us != nil {
		c.keys(o, "spec.updateStrategy", us, "type", "rollingUpdate")
		switch asString(us["type"]) {
		case "RollingUpdate":
			ru := asMap(us["rollingUpdate"])
			c.keys(o, "spec.updateStrategy.rollingUpdate", ru, "maxUnavailable", "maxSurge")
			if fmt.Sprint(ru["maxUnavailable"]) == "0" && fmt.Sprint(ru["maxSurge"]) == "0" {
				c.errorf(o, "spec.updateStrategy.rollingUpdate", "maxUnavailable and maxSurge cannot both be 0")
			}
		case "OnDelete":
		default:
			c.errorf(o, "spec.updateStrategy.type", "%q is not RollingUpdate or OnDelete", us["type"])
		}
	}
	c.podSpec(o, "spec.template.spec", asMap(tmpl["spec"]))
}

func (c *checker) check(o object) {
	switch o.kind() {
	case "ConfigMap":
		c.metadata(o, true)
		c.keys(o, "", o.doc, "apiVersion", "kind", "metadata", "data")
		for k, v := range asMap(o.doc["data"]) {
			if _, ok := v.(string); !ok {
				c.errorf(o, "data."+k, "must be a string, not %T", v)
			}
		}
	case "ServiceAccount":
		c.metadata(o, true)
		c.keys(o, "", o.doc, "apiVersion", "kind", "metadata")
	case "DaemonSet":
		c.metadata(o, true)
		c.daemonSet(o)
	case "Service":
		c.metadata(o, true)
		spec := asMap(o.doc["spec"])
		c.keys(o, "spec", spec, "clusterIP", "selector", "ports")
		for i, p := range asList(spec["ports"]) {
			pm := asMap(p)
			c.keys(o, fmt.Sprintf("spec.ports[%d]", i), pm, "name", "port", "targetPort")
			c.port(o, fmt.Sprintf("spec.ports[%d].port", i), pm["port"])
		}
		if len(asMap(spec["selector"])) == 0 {
			c.errorf(o, "spec.selector", "required")
		}
	case "ClusterRole":
		c.metadata(o, false)
		for i, r := range asList(o.doc["rules"]) {
			c.keys(o, fmt.Sprintf("rules[%d]", i), asMap(r), "apiGroups", "resources", "verbs")
		}
	case "ClusterRoleBinding":
		c.metadata(o, false)
		ref := asMap(o.doc["roleRef"])
		if ref["kind"] != "ClusterRole" || !c.has("ClusterRole", asString(ref["name"])) {
			c.errorf(o, "roleRef", "no ClusterRole %q is rendered", ref["name"])
		}
		for i, s := range asList(o.doc["subjects"]) {
			sm := asMap(s)
			if sm["kind"] == "ServiceAccount" && !c.has("ServiceAccount", asString(sm["name"])) {
				c.errorf(o, fmt.Sprintf("subjects[%d]", i), "no ServiceAccount %q is rendered", sm["name"])
			}
		}
	case "DeviceClass":
		c.metadata(o, false)
		if o.doc["apiVersion"] != "resource.k8s.io/v1" {
			c.errorf(o, "apiVersion", "resource.k8s.io/v1 is the DRA API this chart writes")
		}
		spec := asMap(o.doc["spec"])
		c.keys(o, "spec", spec, "selectors", "extendedResourceName")
		if len(asList(spec["selectors"])) == 0 {
			c.errorf(o, "spec.selectors", "required: a DeviceClass without selectors selects every device")
		}
		for i, sel := range asList(spec["selectors"]) {
			c.keys(o, fmt.Sprintf("spec.selectors[%d]", i), asMap(sel), "cel")
			cel := asMap(asMap(sel)["cel"])
			c.keys(o, fmt.Sprintf("spec.selectors[%d].cel", i), cel, "expression")
			if asString(cel["expression"]) == "" {
				c.errorf(o, fmt.Sprintf("spec.selectors[%d].cel.expression", i), "required")
			}
		}
		if name := asString(spec["extendedResourceName"]); name != "" && !strings.Contains(name, "/") {
			c.errorf(o, "spec.extendedResourceName", "%q is not DOMAIN/NAME", name)
		}
	case "ServiceMonitor", "PodMonitor":
		c.metadata(o, true)
		if o.doc["apiVersion"] != "monitoring.coreos.com/v1" {
			c.errorf(o, "apiVersion", "the Prometheus Operator's is monitoring.coreos.com/v1")
		}
		spec := asMap(o.doc["spec"])
		key := "endpoints"
		if o.kind() == "PodMonitor" {
			key = "podMetricsEndpoints"
		}
		c.keys(o, "spec", spec, "selector", key)
		for i, e := range asList(spec[key]) {
			em := asMap(e)
			c.keys(o, fmt.Sprintf("spec.%s[%d]", key, i), em, "port", "path", "interval")
			if iv := asString(em["interval"]); iv != "" && !duration.MatchString(iv) {
				c.errorf(o, fmt.Sprintf("spec.%s[%d].interval", key, i), "%q is not a duration", iv)
			}
		}
	default:
		c.errorf(o, "kind", "not a kind this chart renders")
	}
}

// setValue applies one --set KEY=VALUE as Helm does for the simple cases:
// a dotted key makes nested maps; true, false, null and integers are typed,
// anything else is a string.
func setValue(values map[string]interface{}, kv string) error {
	eq := strings.Index(kv, "=")
	if eq <= 0 {
		return fmt.Errorf("--set %q is not KEY=VALUE", kv)
	}
	keys := strings.Split(kv[:eq], ".")
	raw := kv[eq+1:]
	var v interface{} = raw
	switch {
	case raw == "true":
		v = true
	case raw == "false":
		v = false
	case raw == "null":
		v = nil
	default:
		if n, err := strconv.ParseInt(raw, 10, 64); err == nil {
			v = n
		}
	}
	m := values
	for _, k := range keys[:len(keys)-1] {
		next, ok := m[k].(map[string]interface{})
		if !ok {
			next = map[string]interface{}{}
			m[k] = next
		}
		m = next
	}
	m[keys[len(keys)-1]] = v
	return nil
}

func main() {
	var valueFiles, sets multiFlag
	flag.Var(&valueFiles, "values", "a values file merged over values.yaml (repeatable; later wins)")
	flag.Var(&sets, "set", "a value as helm's --set KEY=VALUE, after the values files (repeatable)")
	release := flag.String("release", "dpproxy", "the release name")
	namespace := flag.String("namespace", "kube-system", "the release namespace")
	check := flag.Bool("check", false, "validate the rendered objects; errors name the object and field")
	data := flag.String("data", "", "print one entry of a rendered ConfigMap: ConfigMap/NAME/KEY")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: helm_render [--values F]... [--set K=V]... [--release R] [--namespace N] [--check] [--data ConfigMap/NAME/KEY] CHART_DIR\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	chartDir := flag.Arg(0)
	values, err := readYAMLMap(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		fail("%v", err)
	}
	for _, f := range valueFiles {
		more, err := readYAMLMap(f)
		if err != nil {
			fail("%v", err)
		}
		values = mergeValues(values, more)
	}
	for _, kv := range sets {
		if err := setValue(values, kv); err != nil {
			fail("%v", err)
		}
	}
	if err := validateValues(chartDir, values); err != nil {
		fail("%v", err)
	}
	rendered, err := render(chartDir, values, *release, *namespace)
	if err != nil {
		fail("%v", err)
	}
	objs, err := splitObjects(rendered)
	if err != nil {
		fail("%v", err)
	}
	if *check {
		c := &checker{objs: objs}
		for _, o := range objs {
			c.check(o)
		}
		if len(c.errs) > 0 {
			sort.Strings(c.errs)
			for _, e := range c.errs {
				fmt.Fprintln(os.Stderr, e)
			}
			fail("%d error(s) in the rendered objects", len(c.errs))
		}
	}
	if *data != "" {
		parts := strings.SplitN(*data, "/", 3)
		if len(parts) != 3 {
			fail("--data=%s is not ConfigMap/NAME/KEY", *data)
		}
		for _, o := range objs {
			if o.kind() == parts[0] && o.name() == parts[1] {
				if v, ok := asMap(o.doc["data"])[parts[2]].(string); ok {
					fmt.Print(v)
					return
				}
			}
		}
		fail("no %s is rendered", *data)
	}
	var files []string
	for f := range rendered {
		files = append(files, f)
	}
	sort.Strings(files)
	for _, f := range files {
		if strings.HasSuffix(f, ".txt") || strings.TrimSpace(rendered[f]) == "" {
			continue
		}
		fmt.Printf("---\n# Source: %s\n%s\n", filepath.Join(filepath.Base(chartDir), f),
			strings.TrimSpace(rendered[f]))
	}
}
