/**
 * The one builder of a scaled, client-facing service: Deployment + Service + HorizontalPodAutoscaler
 * + PodDisruptionBudget. The API and the router are both made here, so the two can differ only in
 * what they declare (command, env, mounts, grace period, replica bounds), never in how their
 * Deployment, rollout, autoscaling or disruption budget are written.
 */
import type * as k8s from '@pulumi/kubernetes';
import { scrapeAnnotations } from '../runtime-settings.ts';
import {
  labels,
  type ObjectList,
  type PublicExposure,
  type PublicServiceArgs,
  pullSecretsOf,
  type RenderContext,
  spreadAcrossNodes,
} from './args.ts';

/** A client-facing Service (`space-api`, `space-router`) with the cloud's exposure. Pure. */
export function publicService(
  namespace: string,
  name: string,
  selector: Record<string, string>,
  svc: PublicServiceArgs,
  exposure: PublicExposure,
): k8s.types.input.core.v1.Service {
  const type = exposure.serviceType ?? 'LoadBalancer';
  const lb = type === 'LoadBalancer';
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: {
      name,
      namespace,
      labels: selector,
      ...(lb && exposure.annotations ? { annotations: { ...exposure.annotations } } : {}),
    },
    spec: {
      type,
      selector,
      ...(lb && exposure.loadBalancerSourceRanges?.length
        ? { loadBalancerSourceRanges: [...exposure.loadBalancerSourceRanges] }
        : {}),
      ports: [
        {
          name: 'http',
          port: svc.port,
          targetPort: svc.targetPort ?? svc.port,
          protocol: 'TCP',
          ...(type === 'NodePort' && svc.nodePort ? { nodePort: svc.nodePort } : {}),
        },
      ],
    },
  };
}

/** What a scaled service declares; the builder writes the rest the same for every such service. */
export interface ScaledServiceSpec {
  /** Component (`api`, `router`): the label, the role prefix, the container and service-account name. */
  readonly component: string;
  /** TCP port the container serves on (HTTP(S), `/readyz`, `/healthz`, `/metrics`). */
  readonly port: number;
  /** The container's command. */
  readonly command: readonly string[];
  /** The container's env. */
  readonly env: k8s.types.input.core.v1.EnvVar[];
  /** The container's mounts and the pod's volumes. */
  readonly volumeMounts: k8s.types.input.core.v1.VolumeMount[];
  readonly volumes: k8s.types.input.core.v1.Volume[];
  /** Seconds a stopping pod gets (requests in flight finish). */
  readonly terminationGracePeriodSeconds: number;
  /** HPA bounds (the Deployment sets no `replicas`: the HPA owns the count). */
  readonly minReplicas: number;
  readonly maxReplicas: number;
  /** Fixed node port when the exposure is `NodePort`. Default: any. */
  readonly nodePort?: number;
}

/**
 * Adds `space-<component>`'s Deployment, Service, HPA and PDB to `list` (roles `<component>`,
 * `<component>-svc`, `-hpa`, `-pdb`). Non-root, read-only root filesystem, no capabilities, no
 * service-account token; a new pod is ready before an old one goes; CPU-based autoscaling at 70 %;
 * replicas spread across nodes, and voluntary disruptions take one pod at a time. With TLS the Service listens on 443.
 */
export function addScaledService(list: ObjectList, ctx: RenderContext, s: ScaledServiceSpec): void {
  const { ns, version, scheme } = ctx;
  const name = `space-${s.component}`;
  const sel = labels(s.component);
  const deployment: k8s.types.input.apps.v1.Deployment = {
    apiVersion: 'apps/v1',
    kind: 'Deployment',
    metadata: { name, namespace: ns, labels: { ...sel, ...version } },
    spec: {
      // no `replicas`: the HPA owns the count (minReplicas). A replicas field here would reset the
      // Deployment to it on every `pulumi up`, fighting the autoscaler
      // (kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/#migrating-deployments-and-statefulsets-to-horizontal-autoscaling)
      selector: { matchLabels: sel },
      // a new pod is ready before an old one goes: the service never drops below its replica count
      strategy: { type: 'RollingUpdate', rollingUpdate: { maxUnavailable: 0, maxSurge: 1 } },
      template: {
        metadata: { labels: { ...sel, ...version }, annotations: scrapeAnnotations(s.port) },
        spec: {
          serviceAccountName: name,
          automountServiceAccountToken: false,
          ...pullSecretsOf(ctx.a.imagePull),
          terminationGracePeriodSeconds: s.terminationGracePeriodSeconds,
          securityContext: { runAsNonRoot: true, runAsUser: 1000, runAsGroup: 1000, fsGroup: 1000 },
          // replicas on different nodes: losing one node leaves the others serving
          topologySpreadConstraints: spreadAcrossNodes(sel),
          containers: [
            {
              name: s.component,
              image: ctx.image,
              command: [...s.command],
              env: s.env,
              ports: [{ name: 'http', containerPort: s.port }],
              readinessProbe: { httpGet: { path: '/readyz', port: s.port, scheme }, periodSeconds: 5 },
              livenessProbe: {
                httpGet: { path: '/healthz', port: s.port, scheme },
                periodSeconds: 10,
                failureThreshold: 6,
              },
              resources: { requests: { cpu: '250m', memory: '256Mi' }, limits: { memory: '1Gi' } },
              securityContext: {
                allowPrivilegeEscalation: false,
                readOnlyRootFilesystem: true,
                capabilities: { drop: ['ALL'] },
              },
              volumeMounts: s.volumeMounts,
            },
          ],
          volumes: s.volumes,
        },
      },
    },
  };
  list.add(s.component, deployment);
  const port = ctx.a.tls ? { port: 443, targetPort: s.port } : { port: s.port };
  list.add(
    `${s.component}-svc`,
    publicService(ns, name, sel, { ...port, ...(s.nodePort ? { nodePort: s.nodePort } : {}) }, ctx.exposure),
  );
  const hpa: k8s.types.input.autoscaling.v2.HorizontalPodAutoscaler = {
    apiVersion: 'autoscaling/v2',
    kind: 'HorizontalPodAutoscaler',
    metadata: { name, namespace: ns, labels: sel },
    spec: {
      scaleTargetRef: { apiVersion: 'apps/v1', kind: 'Deployment', name },
      minReplicas: s.minReplicas,
      maxReplicas: s.maxReplicas,
      metrics: [
        {
          type: 'Resource',
          resource: { name: 'cpu', target: { type: 'Utilization', averageUtilization: 70 } },
        },
      ],
    },
  };
  list.add(`${s.component}-hpa`, hpa);
  const pdb: k8s.types.input.policy.v1.PodDisruptionBudget = {
    apiVersion: 'policy/v1',
    kind: 'PodDisruptionBudget',
    metadata: { name, namespace: ns, labels: sel },
    // one pod at a time: a drain always proceeds (minAvailable 1 blocked it for good when the
    // HPA minimum is 1), and with two or more replicas one keeps serving throughout
    spec: { maxUnavailable: 1, selector: { matchLabels: sel } },
  };
  list.add(`${s.component}-pdb`, pdb);
}
