// Package docs checks the project's Markdown (the README, docs/ and the chart's README): every
// relative link names a file that exists and, with a #fragment, a heading of that file, so that
// moving a section between the README and docs/ cannot leave a dangling link behind.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

var (
	linkRE    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	headingRE = regexp.MustCompile(`(?m)^#{1,6} +(.+?) *$`)
	fenceRE   = regexp.MustCompile("(?ms)^```.*?^```")
)

// anchor is the fragment GitHub gives a heading: lower case, letters, digits, - and _ kept,
// spaces as -, everything else (punctuation, symbols such as →) dropped.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors are the fragments of a Markdown file's headings (a repeated heading gets -1, -2, ...).
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, m := range headingRE.FindAllStringSubmatch(fenceRE.ReplaceAllString(text, ""), -1) {
		a := anchor(m[1])
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

func TestRelativeLinks(t *testing.T) {
	root := filepath.Join("..", "..")
	files := []string{filepath.Join(root, "README.md"), filepath.Join(root, "charts", "lbsvc-operator", "README.md")}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil || len(more) == 0 {
		t.Fatalf("no docs/*.md under %s: %v", root, err)
	}
	files = append(files, more...)
	texts := map[string]string{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		texts[filepath.Clean(f)] = string(data)
	}
	checked := 0
	for _, f := range files {
		text := fenceRE.ReplaceAllString(texts[filepath.Clean(f)], "")
		for _, m := range linkRE.FindAllStringSubmatch(text, -1) {
			link := m[1]
			if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
				continue
			}
			path, frag, _ := strings.Cut(link, "#")
			target := filepath.Clean(f)
			if path != "" {
				target = filepath.Clean(filepath.Join(filepath.Dir(f), path))
				if _, err := os.Stat(target); err != nil {
					t.Errorf("%s: link %q: %s does not exist", f, link, target)
					continue
				}
			}
			checked++
			if frag == "" {
				continue
			}
			body, ok := texts[target]
			if !ok {
				t.Errorf("%s: link %q: a fragment into a file that is not Markdown checked here", f, link)
				continue
			}
			if !anchors(body)[frag] {
				t.Errorf("%s: link %q: %s has no heading #%s", f, link, target, frag)
			}
		}
	}
	if checked < 50 {
		t.Fatalf("only %d relative links checked: the link pattern no longer matches the docs", checked)
	}
}

func TestAnchor(t *testing.T) {
	for in, want := range map[string]string{
		"Subnet (`lbsvc.io/v1alpha1`, cluster-scoped)":                 "subnet-lbsvciov1alpha1-cluster-scoped",
		"The standby election (`lbpod/ha`)":                            "the-standby-election-lbpodha",
		"Server-side apply and replacing the template":                 "server-side-apply-and-replacing-the-template",
		"Lb pods: ClusterRole `lbsvc-lbpod`, bound once per namespace": "lb-pods-clusterrole-lbsvc-lbpod-bound-once-per-namespace",
		"Service created → first answer, step by step":                 "service-created--first-answer-step-by-step",
	} {
		if got := anchor(in); got != want {
			t.Errorf("anchor(%q) = %q, want %q", in, got, want)
		}
	}
}
