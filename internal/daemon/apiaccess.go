package daemon

import (
	"fmt"
	"strings"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/report"
)

// apiAccess is the one API client of the features that reach the API
// server without client-go (events, nodeCondition, nodeLabels: node,
// remediation.cordon), and the Node they act on.
type apiAccess struct {
	client *kubeapi.Client
	server string
	node   string
}

// apiUsers names the settings on that need apiAccess; none, none needs it.
func apiUsers(cfg config.Config) []string {
	var on []string
	if cfg.Events {
		on = append(on, "events")
	}
	if cfg.NodeCondition {
		on = append(on, "nodeCondition")
	}
	if cfg.NodeLabels == config.NodeLabelsNode || cfg.NodeLabels == config.NodeLabelsNodeFeature {
		on = append(on, "nodeLabels: "+cfg.NodeLabels)
	}
	if cordonOn(cfg) {
		on = append(on, "remediation.cordon")
	}
	return on
}

// newAPIAccess builds the client from cfg.Kubeconfig, else the pod's
// service account; nil when no setting needs it. obs, when not nil, is
// told of every request (the metrics).
func newAPIAccess(cfg config.Config, obs kubeapi.RequestObserver) (*apiAccess, error) {
	users := apiUsers(cfg)
	if len(users) == 0 {
		return nil, nil
	}
	what := strings.Join(users, " and ")
	var kc kubeapi.Config
	var err error
	if cfg.Kubeconfig != "" {
		kc, err = kubeapi.LoadKubeconfig(cfg.Kubeconfig)
	} else {
		kc, err = kubeapi.InCluster()
	}
	if err != nil {
		return nil, fmt.Errorf("%s need API access: set kubeconfig (--kubeconfig) or run in a pod with a service account: %w", what, err)
	}
	kc.UserAgent = report.DefaultComponent
	kc.FieldManager = config.FieldManager
	var opts []kubeapi.Option
	if obs != nil {
		opts = append(opts, kubeapi.WithRequestObserver(obs))
	}
	client, err := kubeapi.New(kc, opts...)
	if err != nil {
		return nil, fmt.Errorf("%s: API client: %w", what, err)
	}
	node, err := cfg.Node()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return &apiAccess{client: client, server: kc.Server, node: node}, nil
}
