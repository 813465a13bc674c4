// Package v1alpha1 holds the lbsvc.io/v1alpha1 API: the cluster-scoped Subnet that LoadBalancer
// Services draw their underlay addresses from, and the annotation keys the operator reads and writes.
//
// +kubebuilder:object:generate=true
// +groupName=lbsvc.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of every type in this package.
	GroupVersion = schema.GroupVersion{Group: "lbsvc.io", Version: "v1alpha1"}

	// SchemeBuilder registers this package's types with a runtime.Scheme. It uses apimachinery
	// only, so that importing the API pulls in no controller-runtime.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds this package's types to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &Subnet{}, &SubnetList{}, &IP{}, &IPList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
