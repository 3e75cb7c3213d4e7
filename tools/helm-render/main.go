// helm-render renders a Helm chart the way `helm template` does, for checking
// charts on machines without helm (see README.md for what it does not do).
//
//	helm-render [-f values.yaml]... [--namespace NS] [--kube-version v1.30.0]
//	            [--api-versions group/version]... [--notes] NAME CHARTDIR
//
// Output: the rendered objects as one multi-document YAML stream on stdout,
// each document headed by `# Source: CHART/templates/FILE`, in Helm's install
// order by kind. With --notes, templates/NOTES.txt is rendered instead.
// Any template error, failed `required`/`fail`, or document that is not valid
// YAML exits 1 with the message on stderr.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/template"

	"github.com/Masterminds/semver/v3"
	"github.com/Masterminds/sprig/v3"
	"sigs.k8s.io/yaml"
)

// Metadata is the part of Chart.yaml templates see as .Chart (Helm exposes
// the same field names).
type Metadata struct {
	APIVersion  string   `json:"apiVersion"`
	Name        string   `json:"name"`
	Version     string   `json:"version"`
	AppVersion  string   `json:"appVersion"`
	Description string   `json:"description"`
	Type        string   `json:"type"`
	KubeVersion string   `json:"kubeVersion"`
	Home        string   `json:"home"`
	Keywords    []string `json:"keywords"`
}

// KubeVersion mirrors .Capabilities.KubeVersion.
type KubeVersion struct {
	Version    string
	Major      string
	Minor      string
	GitVersion string
}

func (k KubeVersion) String() string { return k.Version }

// VersionSet mirrors .Capabilities.APIVersions.
type VersionSet []string

// Has reports whether an API version ("apps/v1") or kind ("apps/v1/Deployment") is known.
func (v VersionSet) Has(s string) bool {
	for _, x := range v {
		if x == s {
			return true
		}
	}
	return false
}

// Capabilities mirrors .Capabilities.
type Capabilities struct {
	KubeVersion KubeVersion
	APIVersions VersionSet
}

// The built-in API versions a cluster always serves (the ones this chart
// could ask about); --api-versions adds more, as with helm.
var defaultAPIVersions = []string{
	"v1", "apps/v1", "batch/v1", "policy/v1", "rbac.authorization.k8s.io/v1",
	"coordination.k8s.io/v1", "networking.k8s.io/v1", "storage.k8s.io/v1",
	"scheduling.k8s.io/v1", "events.k8s.io/v1", "apiextensions.k8s.io/v1",
	"admissionregistration.k8s.io/v1", "autoscaling/v2",
}

// Helm's install order: objects others depend on first. Unknown kinds last.
var installOrder = []string{
	"Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange", "PodSecurityPolicy",
	"PodDisruptionBudget", "ServiceAccount", "Secret", "SecretList", "ConfigMap",
	"StorageClass", "PersistentVolume", "PersistentVolumeClaim", "CustomResourceDefinition",
	"ClusterRole", "ClusterRoleList", "ClusterRoleBinding", "ClusterRoleBindingList",
	"Role", "RoleList", "RoleBinding", "RoleBindingList", "Service", "DaemonSet", "Pod",
	"ReplicationController", "ReplicaSet", "Deployment", "HorizontalPodAutoscaler",
	"StatefulSet", "Job", "CronJob", "IngressClass", "Ingress", "APIService",
}

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "helm-render:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fl := flag.NewFlagSet("helm-render", flag.ContinueOnError)
	var valueFiles, apiVersions stringList
	fl.Var(&valueFiles, "f", "values file (repeatable; later files win)")
	namespace := fl.String("namespace", "default", "release namespace")
	kubeVersion := fl.String("kube-version", "v1.30.0", "Kubernetes version for .Capabilities")
	fl.Var(&apiVersions, "api-versions", "extra API version for .Capabilities.APIVersions (repeatable)")
	notes := fl.Bool("notes", false, "render templates/NOTES.txt instead of the objects")
	if err := fl.Parse(reorderFlags(args)); err != nil {
		return err
	}
	if fl.NArg() != 2 {
		return errors.New("usage: helm-render [flags] NAME CHARTDIR")
	}
	name, chartDir := fl.Arg(0), fl.Arg(1)

	var meta Metadata
	if err := readYAML(filepath.Join(chartDir, "Chart.yaml"), &meta); err != nil {
		return err
	}
	if meta.Name == "" || meta.Version == "" {
		return errors.New("Chart.yaml: name and version must be set")
	}
	values := map[string]interface{}{}
	if err := readYAML(filepath.Join(chartDir, "values.yaml"), &values); err != nil {
		return err
	}
	for _, f := range valueFiles {
		override := map[string]interface{}{}
		if err := readYAML(f, &override); err != nil {
			return err
		}
		values = mergeValues(values, override)
	}
	kv, err := parseKubeVersion(*kubeVersion)
	if err != nil {
		return err
	}
	if meta.KubeVersion != "" {
		// As helm: the chart's kubeVersion constraint against --kube-version.
		c, err := semver.NewConstraint(meta.KubeVersion)
		if err != nil {
			return fmt.Errorf("Chart.yaml kubeVersion %q: %v", meta.KubeVersion, err)
		}
		if !c.Check(semver.MustParse(kv.Version)) {
			return fmt.Errorf("chart requires kubeVersion: %s which is incompatible with Kubernetes %s",
				meta.KubeVersion, kv.Version)
		}
	}
	top := map[string]interface{}{
		"Values": values,
		"Chart":  meta,
		"Release": map[string]interface{}{
			"Name": name, "Namespace": *namespace, "Service": "Helm",
			"Revision": 1, "IsInstall": true, "IsUpgrade": false,
		},
		"Capabilities": Capabilities{
			KubeVersion: kv,
			APIVersions: append(append(VersionSet{}, defaultAPIVersions...), apiVersions...),
		},
	}

	srcs, err := loadTemplates(chartDir, meta.Name)
	if err != nil {
		return err
	}
	r := &renderer{sources: srcs}
	if err := r.parse(); err != nil {
		return err
	}
	if *notes {
		notesName := meta.Name + "/templates/NOTES.txt"
		if _, ok := srcs[notesName]; !ok {
			return errors.New("chart has no templates/NOTES.txt")
		}
		out, err := r.execute(notesName, top)
		if err != nil {
			return err
		}
		fmt.Print(out)
		return nil
	}
	docs, err := r.renderAll(top)
	if err != nil {
		return err
	}
	for _, d := range docs {
		fmt.Printf("---\n# Source: %s\n%s\n", d.source, d.text)
	}
	return nil
}

// reorderFlags lets flags follow the positional arguments, as helm allows.
func reorderFlags(args []string) []string {
	var flags, pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if strings.HasPrefix(a, "-") && len(a) > 1 {
			flags = append(flags, a)
			isBool := a == "--notes" || a == "-notes" || strings.Contains(a, "=")
			if !isBool && i+1 < len(args) {
				flags = append(flags, args[i+1])
				i++
			}
			continue
		}
		pos = append(pos, a)
	}
	return append(flags, pos...)
}

func readYAML(path string, out interface{}) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	// Helm reads values through sigs.k8s.io/yaml, so numbers become float64
	// here exactly as they do in helm (`{{ .Values.big }}` prints 1e+06).
	if err := yaml.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s: %v", path, err)
	}
	return nil
}

// mergeValues returns base with override laid over it: maps merge key by
// key, anything else is replaced, and a null in override deletes the key
// (Helm's rule for user-supplied values).
func mergeValues(base, override map[string]interface{}) map[string]interface{} {
	out := make(map[string]interface{}, len(base))
	for k, v := range base {
		out[k] = v
	}
	for k, ov := range override {
		if ov == nil {
			delete(out, k)
			continue
		}
		bm, bok := out[k].(map[string]interface{})
		om, ook := ov.(map[string]interface{})
		if bok && ook {
			out[k] = mergeValues(bm, om)
		} else {
			out[k] = ov
		}
	}
	return out
}

func parseKubeVersion(v string) (KubeVersion, error) {
	s := strings.TrimPrefix(v, "v")
	parts := strings.SplitN(s, ".", 3)
	if len(parts) < 2 {
		return KubeVersion{}, fmt.Errorf("--kube-version %q: want vMAJOR.MINOR[.PATCH]", v)
	}
	full := "v" + s
	if len(parts) == 2 {
		full += ".0"
	}
	return KubeVersion{Version: full, Major: parts[0], Minor: parts[1], GitVersion: full}, nil
}

// loadTemplates reads every file under templates/, keyed "CHART/templates/REL".
func loadTemplates(chartDir, chartName string) (map[string]string, error) {
	srcs := map[string]string{}
	root := filepath.Join(chartDir, "templates")
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		srcs[chartName+"/templates/"+filepath.ToSlash(rel)] = string(data)
		return nil
	})
	return srcs, err
}

type renderer struct {
	sources map[string]string
	root    *template.Template
}

type document struct {
	source string
	kind   string
	text   string
}

// funcMap is sprig's (less env/expandenv, as in helm) plus helm's own
// functions. include and tpl need the parsed set, so they close over r.
func (r *renderer) funcMap() template.FuncMap {
	fm := sprig.TxtFuncMap()
	delete(fm, "env")
	delete(fm, "expandenv")
	fm["toYaml"] = func(v interface{}) string {
		b, err := yaml.Marshal(v)
		if err != nil {
			return ""
		}
		return strings.TrimSuffix(string(b), "\n")
	}
	fm["fromYaml"] = func(s string) map[string]interface{} {
		m := map[string]interface{}{}
		if err := yaml.Unmarshal([]byte(s), &m); err != nil {
			m["Error"] = err.Error()
		}
		return m
	}
	fm["toJson"] = func(v interface{}) string {
		b, err := json.Marshal(v)
		if err != nil {
			return ""
		}
		return string(b)
	}
	fm["fromJson"] = func(s string) map[string]interface{} {
		m := map[string]interface{}{}
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			m["Error"] = err.Error()
		}
		return m
	}
	fm["required"] = func(msg string, v interface{}) (interface{}, error) {
		if v == nil {
			return v, errors.New(msg)
		}
		if s, ok := v.(string); ok && s == "" {
			return v, errors.New(msg)
		}
		return v, nil
	}
	fm["include"] = func(name string, data interface{}) (string, error) {
		var buf bytes.Buffer
		if err := r.root.ExecuteTemplate(&buf, name, data); err != nil {
			return "", err
		}
		return buf.String(), nil
	}
	fm["tpl"] = func(text string, data interface{}) (string, error) {
		// A fresh set holding the chart's defines, so tpl text can include them.
		t, err := r.newSet()
		if err != nil {
			return "", err
		}
		t, err = t.New("tpl").Parse(text)
		if err != nil {
			return "", fmt.Errorf("tpl: %v", err)
		}
		var buf bytes.Buffer
		if err := t.Execute(&buf, data); err != nil {
			return "", fmt.Errorf("tpl: %v", err)
		}
		return strings.ReplaceAll(buf.String(), "<no value>", ""), nil
	}
	fm["lookup"] = func(string, string, string, string) (map[string]interface{}, error) {
		return map[string]interface{}{}, nil // helm template also answers empty
	}
	return fm
}

func (r *renderer) newSet() (*template.Template, error) {
	t := template.New("").Funcs(r.funcMap()).Option("missingkey=zero")
	names := make([]string, 0, len(r.sources))
	for n := range r.sources {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if _, err := t.New(n).Parse(r.sources[n]); err != nil {
			return nil, err
		}
	}
	return t, nil
}

func (r *renderer) parse() error {
	t, err := r.newSet()
	if err != nil {
		return err
	}
	r.root = t
	return nil
}

func (r *renderer) execute(name string, top map[string]interface{}) (string, error) {
	var buf bytes.Buffer
	data := map[string]interface{}{}
	for k, v := range top {
		data[k] = v
	}
	data["Template"] = map[string]interface{}{
		"Name": name, "BasePath": name[:strings.Index(name, "/templates/")+len("/templates")],
	}
	if err := r.root.ExecuteTemplate(&buf, name, data); err != nil {
		return "", err
	}
	return strings.ReplaceAll(buf.String(), "<no value>", ""), nil
}

// renderAll renders every template whose file name does not start with "_"
// (and is not NOTES.txt), splits the output into documents, checks each is
// YAML and sorts them by kind.
func (r *renderer) renderAll(top map[string]interface{}) ([]document, error) {
	names := make([]string, 0, len(r.sources))
	for n := range r.sources {
		base := filepath.Base(n)
		if strings.HasPrefix(base, "_") || base == "NOTES.txt" {
			continue
		}
		names = append(names, n)
	}
	sort.Strings(names)
	var docs []document
	for _, n := range names {
		out, err := r.execute(n, top)
		if err != nil {
			return nil, err
		}
		for _, text := range splitDocuments(out) {
			var obj struct {
				Kind string `json:"kind"`
			}
			if err := yaml.Unmarshal([]byte(text), &obj); err != nil {
				return nil, fmt.Errorf("YAML parse error on %s: %v", n, err)
			}
			docs = append(docs, document{source: n, kind: obj.Kind, text: text})
		}
	}
	rank := map[string]int{}
	for i, k := range installOrder {
		rank[k] = i
	}
	order := func(kind string) int {
		if i, ok := rank[kind]; ok {
			return i
		}
		return len(installOrder)
	}
	sort.SliceStable(docs, func(i, j int) bool { return order(docs[i].kind) < order(docs[j].kind) })
	return docs, nil
}

// splitDocuments splits on `---` lines and drops documents with nothing but
// whitespace or comments (a disabled template renders to nothing).
func splitDocuments(s string) []string {
	var out []string
	var cur []string
	flush := func() {
		text := strings.TrimSpace(strings.Join(cur, "\n"))
		if text != "" && !onlyComments(text) {
			out = append(out, text)
		}
		cur = nil
	}
	for _, line := range strings.Split(s, "\n") {
		if strings.TrimRight(line, " ") == "---" {
			flush()
			continue
		}
		cur = append(cur, line)
	}
	flush()
	return out
}

func onlyComments(text string) bool {
	for _, line := range strings.Split(text, "\n") {
		l := strings.TrimSpace(line)
		if l != "" && !strings.HasPrefix(l, "#") {
			return false
		}
	}
	return true
}
