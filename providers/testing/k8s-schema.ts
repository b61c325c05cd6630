/**
 * Validates Kubernetes objects against the Kubernetes OpenAPI schemas, using `kubernetes-models`
 * (generated from the upstream OpenAPI document; each model's `validate()` runs a compiled JSON
 * Schema validator). Those schemas allow unknown fields, so misspelt fields are caught by the
 * TypeScript input types the renderers use instead.
 */
import { Certificate } from '@kubernetes-models/cert-manager/cert-manager.io/v1/Certificate';
import { DaemonSet } from 'kubernetes-models/apps/v1/DaemonSet';
import { Deployment } from 'kubernetes-models/apps/v1/Deployment';
import { StatefulSet } from 'kubernetes-models/apps/v1/StatefulSet';
import { HorizontalPodAutoscaler } from 'kubernetes-models/autoscaling/v2/HorizontalPodAutoscaler';
import { NetworkPolicy } from 'kubernetes-models/networking.k8s.io/v1/NetworkPolicy';
import { PodDisruptionBudget } from 'kubernetes-models/policy/v1/PodDisruptionBudget';
import { ClusterRole } from 'kubernetes-models/rbac.authorization.k8s.io/v1/ClusterRole';
import { ClusterRoleBinding } from 'kubernetes-models/rbac.authorization.k8s.io/v1/ClusterRoleBinding';
import { ConfigMap } from 'kubernetes-models/v1/ConfigMap';
import { Namespace } from 'kubernetes-models/v1/Namespace';
import { Secret } from 'kubernetes-models/v1/Secret';
import { Service } from 'kubernetes-models/v1/Service';
import { ServiceAccount } from 'kubernetes-models/v1/ServiceAccount';

interface Validatable {
  validate(): void;
}
type ModelCtor = new (data: Record<string, unknown>) => Validatable;

/** Model class by `apiVersion/kind`. */
export const MODELS: Readonly<Record<string, ModelCtor>> = {
  'v1/Namespace': Namespace as unknown as ModelCtor,
  'v1/ServiceAccount': ServiceAccount as unknown as ModelCtor,
  'v1/Secret': Secret as unknown as ModelCtor,
  'v1/ConfigMap': ConfigMap as unknown as ModelCtor,
  'v1/Service': Service as unknown as ModelCtor,
  'apps/v1/StatefulSet': StatefulSet as unknown as ModelCtor,
  'apps/v1/Deployment': Deployment as unknown as ModelCtor,
  'apps/v1/DaemonSet': DaemonSet as unknown as ModelCtor,
  'autoscaling/v2/HorizontalPodAutoscaler': HorizontalPodAutoscaler as unknown as ModelCtor,
  'policy/v1/PodDisruptionBudget': PodDisruptionBudget as unknown as ModelCtor,
  'networking.k8s.io/v1/NetworkPolicy': NetworkPolicy as unknown as ModelCtor,
  'rbac.authorization.k8s.io/v1/ClusterRole': ClusterRole as unknown as ModelCtor,
  'rbac.authorization.k8s.io/v1/ClusterRoleBinding': ClusterRoleBinding as unknown as ModelCtor,
  // cert-manager's CRD schema (@kubernetes-models/cert-manager, generated from cert-manager's CRDs)
  'cert-manager.io/v1/Certificate': Certificate as unknown as ModelCtor,
};

/** Schema problems of `obj` (empty when valid); an unknown apiVersion/kind is a problem too. */
export function schemaProblems(obj: Record<string, unknown>): string[] {
  const key = `${obj['apiVersion']}/${obj['kind']}`;
  const Model = MODELS[key];
  if (!Model) return [`${key}: no schema known`];
  try {
    new Model(obj).validate();
    return [];
  } catch (err) {
    return [
      `${key} ${JSON.stringify((obj['metadata'] as { name?: string } | undefined)?.name)}: ${(err as Error).message}`,
    ];
  }
}
