package v1alpha1_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"
)

// subnetSchema is the structural schema of the Subnet's spec (crdSpecSchema).
func subnetSchema(t *testing.T) *schema.Structural {
	return crdSpecSchema(t, "../../config/crd/bases/lbsvc.io_subnets.yaml")
}

// crdSpecSchema loads a generated CRD, checks it the way the API server checks a CRD on
// create (CEL rules compile, their estimated cost fits the budget) and returns the structural
// schema of spec. The API server's own code, in process: the CEL rules are tested in every unit
// run, not only with a kube-apiserver.
func crdSpecSchema(t *testing.T, path string) *schema.Structural {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var v1crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(raw, &v1crd); err != nil {
		t.Fatal(err)
	}
	var crd apiextensions.CustomResourceDefinition
	if err := apiextensionsv1.Convert_v1_CustomResourceDefinition_To_apiextensions_CustomResourceDefinition(&v1crd, &crd, nil); err != nil {
		t.Fatal(err)
	}
	// The API server fills status.storedVersions itself; the validation wants it.
	crd.Status.StoredVersions = []string{crd.Spec.Versions[0].Name}
	if errs := validation.ValidateCustomResourceDefinition(context.Background(), &crd); len(errs) > 0 {
		t.Fatalf("the API server would refuse the CRD: %v", errs.ToAggregate())
	}
	// The internal form hoists a schema shared by all versions to spec.validation.
	validationSchema := crd.Spec.Validation
	if validationSchema == nil {
		validationSchema = crd.Spec.Versions[0].Schema
	}
	s, err := schema.NewStructural(validationSchema.OpenAPIV3Schema)
	if err != nil {
		t.Fatal(err)
	}
	spec := s.Properties["spec"]
	return &spec
}

// TestSubnetCEL runs the Subnet's x-kubernetes-validations on specs, on create (no old object).
func TestSubnetCEL(t *testing.T) {
	s := subnetSchema(t)
	validator := cel.NewValidator(s, false, celconfig.PerCallLimit)
	if validator == nil {
		t.Fatal("the spec schema has no CEL rules")
	}
	spec := func(cidrBlock string) map[string]any {
		return map[string]any{"provider": "lb-svc-attachment.kube-system", "cidrBlock": cidrBlock}
	}
	const unicast = "cidrBlock must be unicast host addresses"
	tests := map[string]string{ // cidrBlock -> the message expected, "" when accepted
		"172.18.0.0/16":              "",
		"172.18.0.0/16,fd00:18::/64": "",
		"192.0.2.0/24":               "", // documentation ranges are allowed
		"2001:db8::/32":              "",
		"0.0.0.0/0":                  unicast,
		"::/0":                       unicast,
		"127.0.0.0/8":                unicast,
		"169.254.0.0/16":             unicast,
		"224.0.0.0/4":                unicast,
		"fe80::/64":                  unicast,
		"ff02::/16":                  unicast,
		"172.18.0.0/16,ff02::/16":    unicast,
		"127.0.0.1/8":                unicast, // host bits set: judged by the network
		"10.1.2.300/24":              "cidrBlock must be one CIDR",
	}
	for cidrBlock, want := range tests {
		errs, _ := validator.Validate(context.Background(), field.NewPath("spec"), s, spec(cidrBlock), nil, celconfig.RuntimeCELCostBudget)
		got := errs.ToAggregate()
		switch {
		case want == "" && got != nil:
			t.Errorf("%s: refused: %v", cidrBlock, got)
		case want != "" && (got == nil || !strings.Contains(got.Error(), want)):
			t.Errorf("%s: got %v, want an error containing %q", cidrBlock, got, want)
		}
	}
}

// TestIPCEL runs the IP object's rules on updates: the address, Subnet, owner and sharing key
// never change; the members of a shared address do; an unshared address has none.
func TestIPCEL(t *testing.T) {
	s := crdSpecSchema(t, "../../config/crd/bases/lbsvc.io_ips.yaml")
	validator := cel.NewValidator(s, false, celconfig.PerCallLimit)
	if validator == nil {
		t.Fatal("the spec schema has no CEL rules")
	}
	owner := map[string]any{"namespace": "dns", "name": "dns-tcp", "uid": "u1"}
	spec := func(mut func(map[string]any)) map[string]any {
		m := map[string]any{"address": "172.18.0.12", "subnet": "underlay", "service": owner, "sharingKey": "dns",
			"members": []any{map[string]any{"namespace": "dns", "name": "dns-tcp", "uid": "u1", "ports": []any{"TCP/53"}}}}
		if mut != nil {
			mut(m)
		}
		return m
	}
	member2 := map[string]any{"namespace": "dns", "name": "dns-udp", "uid": "u2", "ports": []any{"UDP/53"}}
	for name, tc := range map[string]struct {
		old, cur map[string]any
		want     string // "" when accepted
	}{
		"a member joins":         {spec(nil), spec(func(m map[string]any) { m["members"] = append(m["members"].([]any), member2) }), ""},
		"the last member leaves": {spec(nil), spec(func(m map[string]any) { delete(m, "members") }), ""},
		"the address changes":    {spec(nil), spec(func(m map[string]any) { m["address"] = "172.18.0.13" }), "address, subnet and service are immutable"},
		"the owner changes": {spec(nil), spec(func(m map[string]any) { m["service"] = map[string]any{"namespace": "dns", "name": "x", "uid": "u9"} }),
			"address, subnet and service are immutable"},
		"the key changes": {spec(nil), spec(func(m map[string]any) { m["sharingKey"] = "web" }), "sharingKey is immutable"},
		"an unshared address becomes shared": {spec(func(m map[string]any) { delete(m, "sharingKey"); delete(m, "members") }), spec(nil),
			"sharingKey is immutable"},
		"members without a key": {spec(func(m map[string]any) { delete(m, "sharingKey"); delete(m, "members") }),
			spec(func(m map[string]any) { delete(m, "sharingKey") }), "only a shared address (sharingKey) has members"},
	} {
		errs, _ := validator.Validate(context.Background(), field.NewPath("spec"), s, tc.cur, tc.old, celconfig.RuntimeCELCostBudget)
		got := errs.ToAggregate()
		switch {
		case tc.want == "" && got != nil:
			t.Errorf("%s: refused: %v", name, got)
		case tc.want != "" && (got == nil || !strings.Contains(got.Error(), tc.want)):
			t.Errorf("%s: got %v, want an error containing %q", name, got, tc.want)
		}
	}
}
