{{/* The release's name prefix for every object. */}}
{{- define "koordbus.fullname" -}}
{{- printf "%s-koordbus" .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- end -}}

{{- define "koordbus.labels" -}}
app.kubernetes.io/name: koordbus
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "koordbus.image" -}}
{{ printf "%s:%s" .Values.image.repository .Values.image.tag }}
{{- end -}}

{{/* Where NATS is: the bundled StatefulSet's Service, or the configured URL. */}}
{{- define "koordbus.natsUrl" -}}
{{- if .Values.nats.bundled.enabled -}}
{{ printf "nats://%s-nats:4222" (include "koordbus.fullname" .) }}
{{- else -}}
{{ .Values.nats.url }}
{{- end -}}
{{- end -}}

{{- define "koordbus.databaseSecret" -}}
{{- .Values.database.existingSecret | default (printf "%s-database" (include "koordbus.fullname" .)) -}}
{{- end -}}

{{/* The environment every service container gets. */}}
{{- define "koordbus.env" -}}
- name: KOORDBUS_NATS_URL
  value: {{ include "koordbus.natsUrl" . | quote }}
- name: KOORDBUS_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "koordbus.databaseSecret" . }}
      key: database-url
- name: KOORDBUS_STREAM_REPLICAS
  value: {{ ternary .Values.nats.bundled.streamReplicas 1 .Values.nats.bundled.enabled | quote }}
- name: KOORDBUS_LOG_FORMAT
  value: {{ .Values.logFormat | quote }}
{{- include "koordbus.natsCredsEnv" . }}
{{- end -}}

{{- define "koordbus.securityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The database URL the release's Secret holds: the configured one, else the bundled PostgreSQL's. */}}
{{- define "koordbus.databaseUrl" -}}
{{- if .Values.database.url -}}
{{ .Values.database.url }}
{{- else if .Values.database.bundled.enabled -}}
{{ printf "postgresql://koordbus:%s@%s-postgresql:5432/koordbus" (required "database.bundled.password is required" .Values.database.bundled.password | urlquery) (include "koordbus.fullname" .) }}
{{- else -}}
{{ required "database.url (or database.existingSecret, or database.bundled.enabled) is required" .Values.database.url }}
{{- end -}}
{{- end -}}

{{/* The Secret holding the NATS identities: the callout's account key and each service user's password. */}}
{{- define "koordbus.natsAuthSecret" -}}
{{- .Values.nats.auth.existingSecret | default (printf "%s-nats-auth" (include "koordbus.fullname" .)) -}}
{{- end -}}

{{/* The NATS users of the release: the callout's own (account AUTH) and one per control-plane process (KOORD). */}}
{{- define "koordbus.natsServiceUsers" -}}
{{- $users := list "api" -}}
{{- range $name, $service := .Values.services -}}
{{- if $service.enabled }}{{ $users = append $users $name }}{{ end -}}
{{- end -}}
{{- join "," (sortAlpha $users) -}}
{{- end -}}

{{/* A control-plane container's NATS credentials (with nats.auth.enabled): KOORDBUS_NATS_CREDS → the mounted file. */}}
{{- define "koordbus.natsCredsEnv" -}}
{{- if .Values.nats.auth.enabled }}
- name: KOORDBUS_NATS_CREDS
  value: /etc/koordbus/nats/creds.json
{{- end }}
{{- end -}}

{{- define "koordbus.natsCredsMount" -}}
{{- if .root.Values.nats.auth.enabled }}
- name: nats-creds
  mountPath: /etc/koordbus/nats
  readOnly: true
{{- end }}
{{- end -}}

{{/* The volume of one service user's credentials file (`service`: its name), from the NATS identities Secret. */}}
{{- define "koordbus.natsCredsVolume" -}}
{{- if .root.Values.nats.auth.enabled }}
- name: nats-creds
  secret:
    secretName: {{ include "koordbus.natsAuthSecret" .root }}
    defaultMode: 0440
    items:
      - {key: {{ printf "%s.creds.json" .service }}, path: creds.json}
      {{- range .extra }}
      - {key: {{ . }}, path: {{ . }}}
      {{- end }}
{{- end }}
{{- end -}}

{{/* Where the admission webhook's certificate comes from: "secret" (the user's, webhook.tls.secretName),
"cert-manager" (webhook.certManager.enabled) or "job" (the hook Job running `koordbus certs webhook`). */}}
{{- define "koordbus.webhookCertMode" -}}
{{- $w := .Values.webhook -}}
{{- if and $w.certManager.enabled $w.tls.secretName -}}
{{- fail "webhook.certManager.enabled and webhook.tls.secretName exclude each other: cert-manager writes the chart's own Secret (set an issuer with webhook.certManager.issuerRef)" -}}
{{- else if $w.tls.secretName -}}
secret
{{- else if $w.certManager.enabled -}}
cert-manager
{{- else -}}
job
{{- end -}}
{{- end -}}

{{/* The Secret with the webhook's tls.crt and tls.key: the user's, or the one cert-manager or the hook Job writes. */}}
{{- define "koordbus.webhookSecret" -}}
{{- .Values.webhook.tls.secretName | default (printf "%s-webhook-tls" (include "koordbus.fullname" .)) -}}
{{- end -}}

{{/* The caBundle of a user's certificate (webhook.tls.caBundle: PEM, or PEM in base64 as the field holds it). */}}
{{- define "koordbus.webhookCaBundle" -}}
{{- $ca := .Values.webhook.tls.caBundle | trim -}}
{{- if hasPrefix "-----BEGIN" $ca -}}
{{ printf "%s\n" $ca | b64enc }}
{{- else -}}
{{ $ca }}
{{- end -}}
{{- end -}}

{{/* One webhook's clientConfig: the webhook Service's HTTPS port (443) at `path`, and the CA that kube-apiserver
trusts for it when the chart knows it (a user's certificate); cert-manager injects it, the hook Job patches it in. */}}
{{- define "koordbus.webhookClientConfig" -}}
service:
  name: {{ include "koordbus.fullname" .root }}-webhook
  namespace: {{ .root.Release.Namespace }}
  path: {{ .path | quote }}
  port: 443
{{- if eq (include "koordbus.webhookCertMode" .root) "secret" }}
caBundle: {{ include "koordbus.webhookCaBundle" .root }}
{{- end }}
{{- end -}}

{{/* The namespaces never sent to the webhooks: webhook.excludeNamespaces (kube-system) and the release's own. */}}
{{- define "koordbus.webhookNamespaceSelector" -}}
matchExpressions:
  - key: kubernetes.io/metadata.name
    operator: NotIn
    values: {{ uniq (append .Values.webhook.excludeNamespaces .Release.Namespace) | toJson }}
{{- end -}}

{{/* failurePolicy and timeoutSeconds of one webhook (`name`: its values key), refused at render when kube-apiserver
would refuse them. */}}
{{- define "koordbus.webhookPolicy" -}}
{{- $hook := index .root.Values.webhook .name -}}
{{- if not (has $hook.failurePolicy (list "Ignore" "Fail")) -}}
{{- fail (printf "webhook.%s.failurePolicy must be Ignore or Fail, got %v" .name $hook.failurePolicy) -}}
{{- end -}}
{{- if or (lt (int $hook.timeoutSeconds) 1) (gt (int $hook.timeoutSeconds) 30) -}}
{{- fail (printf "webhook.%s.timeoutSeconds must be 1–30 (kube-apiserver's bounds; keep it well under 10), got %v" .name $hook.timeoutSeconds) -}}
{{- end -}}
admissionReviewVersions: [v1]
sideEffects: {{ $hook.sideEffects | default "None" }}
matchPolicy: Equivalent
failurePolicy: {{ $hook.failurePolicy }}
timeoutSeconds: {{ int $hook.timeoutSeconds }}
{{- end -}}
