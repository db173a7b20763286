package e2eutil

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"slices"
	"sort"
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/volume-agent/volume-agent/test/cluster"
)

// The suites' TestMains check the API server's audit log after the tests:
// no request of the agents (or the provisioner) was refused, and, on a
// full run, every verb their ClusterRoles grant was used.

// RequestKey names a request in the RBAC checks as Grants names a grant:
// "<verb> <resource>[.<group>][/<subresource>]", or "<verb> <URI>" for a
// request about no object.
func RequestKey(e cluster.AuditEvent) string {
	if e.ObjectRef == nil {
		return e.Verb + " " + e.RequestURI
	}
	return e.Verb + " " + groupResource(e.ObjectRef.APIGroup, e.ObjectRef.Resource, e.ObjectRef.Subresource)
}

// asWatchList marks the list keys of watch-lists in Requests' counts.
const asWatchList = " (as watch-list)"

// Requests counts the requests of user that the API server answered, by
// RequestKey, and returns those it refused (403). A watch-list, a watch
// with sendInitialEvents=true that client-go's informers make instead of a
// LIST where the server supports it, also counts as
// "list <resource> (as watch-list)": it does the list's job (whose grant
// servers without it still need).
func Requests(events []cluster.AuditEvent, user string) (counts map[string]int, refused []cluster.AuditEvent) {
	counts = map[string]int{}
	for _, e := range events {
		if e.User.Username != user || e.Stage != cluster.StageResponseComplete {
			continue
		}
		counts[RequestKey(e)]++
		if e.Verb == "watch" && e.ObjectRef != nil && strings.Contains(e.RequestURI, "sendInitialEvents=true") {
			counts["list "+groupResource(e.ObjectRef.APIGroup, e.ObjectRef.Resource, e.ObjectRef.Subresource)+asWatchList]++
		}
		if e.ResponseStatus != nil && e.ResponseStatus.Code == 403 {
			refused = append(refused, e)
		}
	}
	return counts, refused
}

// Grants lists what the rules grant, as RequestKey names requests, sorted.
func Grants(rules []rbacv1.PolicyRule) []string {
	var granted []string
	for _, rule := range rules {
		for _, g := range rule.APIGroups {
			for _, r := range rule.Resources {
				res, sub, _ := strings.Cut(r, "/")
				for _, v := range rule.Verbs {
					granted = append(granted, v+" "+groupResource(g, res, sub))
				}
			}
		}
	}
	sort.Strings(granted)
	return granted
}

// Unused lists the grants that no counted request used.
func Unused(granted []string, counts map[string]int) []string {
	var unused []string
	for _, g := range granted {
		if counts[g] == 0 && counts[g+asWatchList] == 0 {
			unused = append(unused, g)
		}
	}
	return unused
}

// PrintRequests writes the counts of a user's requests to stderr, marking
// those not granted unless granted is nil.
func PrintRequests(user string, counts map[string]int, granted []string) {
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fmt.Fprintf(os.Stderr, "RBAC check: requests of %s by (verb, resource):\n", user)
	for _, k := range keys {
		mark := ""
		if granted != nil && !slices.Contains(granted, strings.TrimSuffix(k, asWatchList)) {
			mark = "   (not granted)"
		}
		fmt.Fprintf(os.Stderr, "  %-55s %6d%s\n", k, counts[k], mark)
	}
}

// FullRun reports whether every test of the package was selected (neither
// -run nor -skip): a filtered run does not use every grant.
func FullRun() bool {
	for _, name := range []string{"test.run", "test.skip"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" {
			return false
		}
	}
	return true
}

func groupResource(group, resource, sub string) string {
	s := resource
	if group != "" {
		s += "." + group
	}
	if sub != "" {
		s += "/" + sub
	}
	return s
}

// scopedResources are the resources an agent may list or watch only for
// what its node uses: one object by name (secrets, configMaps and claims
// in their namespace), or, for PersistentVolumes, the local volume
// provisioner's own by its node label.
var scopedResources = map[string]bool{
	"secrets": true, "configmaps": true, "persistentvolumeclaims": true, "persistentvolumes": true, "volumeattachments": true,
}

// UnscopedReads lists the lists and watches of scoped resources that
// user made from a client whose user agent starts with agentPrefix
// ("volume-agent/": the agent; tests' own clients, which show what a user
// may do, do not count) without selecting one object by name
// (fieldSelector=metadata.name=<name>, and a namespace for namespaced
// resources) or, for PersistentVolumes, the provisioner's node label: the
// reads whose cost grows with the cluster instead of the node.
func UnscopedReads(events []cluster.AuditEvent, user, agentPrefix string) []string {
	var bad []string
	for _, ev := range events {
		if ev.User.Username != user || !strings.HasPrefix(ev.UserAgent, agentPrefix) || (ev.Verb != "list" && ev.Verb != "watch") || ev.ObjectRef == nil {
			continue
		}
		res := ev.ObjectRef.Resource
		if !scopedResources[res] || ev.ObjectRef.Subresource != "" {
			continue
		}
		u, err := url.Parse(ev.RequestURI)
		if err != nil {
			bad = append(bad, ev.Verb+" "+ev.RequestURI)
			continue
		}
		q := u.Query()
		byName := strings.HasPrefix(q.Get("fieldSelector"), "metadata.name=")
		namespaced := res == "secrets" || res == "configmaps" || res == "persistentvolumeclaims"
		if byName && (!namespaced || ev.ObjectRef.Namespace != "") {
			continue
		}
		if res == "persistentvolumes" && strings.HasPrefix(q.Get("labelSelector"), "local.volume-agent.io/node=") {
			continue
		}
		bad = append(bad, ev.Verb+" "+ev.RequestURI)
	}
	return bad
}
