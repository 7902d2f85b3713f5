{{/* Names, labels and the pieces every pod of the chart shares. */}}

{{- define "isthmus.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "isthmus.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "isthmus.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "isthmus.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: pass (dict "ctx" $ "component" "api"). */}}
{{- define "isthmus.selectorLabels" -}}
app.kubernetes.io/name: {{ include "isthmus.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "isthmus.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "isthmus.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "isthmus.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the database URL: the user's, or the chart's. */}}
{{- define "isthmus.databaseSecret" -}}
{{- if .Values.database.existingSecret -}}
{{- .Values.database.existingSecret -}}
{{- else -}}
{{- include "isthmus.fullname" . -}}
{{- end -}}
{{- end -}}

{{- define "isthmus.databaseSecretKey" -}}
{{- if .Values.database.existingSecret -}}
{{- .Values.database.existingSecretKey -}}
{{- else -}}
database-url
{{- end -}}
{{- end -}}

{{/* The Secret holding the other secret settings: the user's, or the chart's. */}}
{{- define "isthmus.secretsSecret" -}}
{{- default (include "isthmus.fullname" .) .Values.secrets.existingSecret -}}
{{- end -}}

{{/* Refuse, with one line naming the values to set, a release that cannot start. */}}
{{- define "isthmus.validate" -}}
{{- if and (not .Values.database.url) (not .Values.database.existingSecret) -}}
{{- fail "isthmus: set database.url (postgresql+psycopg://USER:PASSWORD@HOST:PORT/DB) or database.existingSecret: Postgres is external to this chart" -}}
{{- end -}}
{{- if and .Values.database.url .Values.database.existingSecret -}}
{{- fail "isthmus: set database.url or database.existingSecret, not both" -}}
{{- end -}}
{{- $owned := dict
  "DATABASE_URL" "database.url or database.existingSecret"
  "POOLS_FILE" "pools (the chart writes and mounts the pools file)"
  "BACKENDS" "pools (a pools file replaces ISTHMUS_BACKENDS: docs/pools.md)"
  "DISPATCH_IN_SERVE" "nothing: the API never dispatches, worker.replicas does"
  "METRICS_TOKEN" "secrets.metricsToken or secrets.existingSecret"
  "METRICS_ACCESS" "metrics.access"
  "UI_CLIENT_SECRET" "secrets.uiClientSecret or secrets.existingSecret"
  "UI_SESSION_SECRET" "secrets.uiSessionSecret or secrets.existingSecret"
  "UI_OIDC_ISSUER" "ui.oidcIssuer"
  "UI_CLIENT_ID" "ui.clientId"
  "OIDC_ISSUERS" "oidc.issuers"
  "AUDIENCE" "oidc.audience"
  "OUTPUT_KEEP_DIR" "outputKeep.existingClaim (the directory is the chart's mount)" -}}
{{- range $k, $_ := .Values.settings -}}
{{- if hasKey $owned $k -}}
{{- fail (printf "isthmus: settings.%s is set by the chart; use %s" $k (get $owned $k)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Environment of every gateway container: the ConfigMap, then the secrets by reference. */}}
{{- define "isthmus.env" -}}
- name: ISTHMUS_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "isthmus.databaseSecret" . }}
      key: {{ include "isthmus.databaseSecretKey" . }}
- name: ISTHMUS_METRICS_TOKEN
  valueFrom:
    secretKeyRef: {name: {{ include "isthmus.secretsSecret" . }}, key: metrics-token, optional: true}
- name: ISTHMUS_UI_CLIENT_SECRET
  valueFrom:
    secretKeyRef: {name: {{ include "isthmus.secretsSecret" . }}, key: ui-client-secret, optional: true}
- name: ISTHMUS_UI_SESSION_SECRET
  valueFrom:
    secretKeyRef: {name: {{ include "isthmus.secretsSecret" . }}, key: ui-session-secret, optional: true}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Pod-level fields shared by the API and the workers. */}}
{{- define "isthmus.podChecksums" -}}
checksum/config: {{ include (print $.Template.BasePath "/configmap.yaml") . | sha256sum }}
checksum/secret: {{ include (print $.Template.BasePath "/secret.yaml") . | sha256sum }}
{{- end -}}

{{- define "isthmus.volumes" -}}
- name: config
  configMap:
    name: {{ include "isthmus.fullname" . }}
- name: tmp
  emptyDir: {}
- name: output
{{- if .Values.outputKeep.existingClaim }}
  persistentVolumeClaim:
    claimName: {{ .Values.outputKeep.existingClaim }}
{{- else }}
  emptyDir: {}
{{- end }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "isthmus.volumeMounts" -}}
- name: config
  mountPath: /etc/isthmus/pools.yaml
  subPath: pools.yaml
  readOnly: true
- name: tmp
  mountPath: /tmp
- name: output
  mountPath: /var/lib/isthmus/output
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}
