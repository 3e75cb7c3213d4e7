# duet_check_layering(): the dependency rules of bridge/README.md, checked at
# configure time over every target and over the #include lines of the folders
# the rules name. A broken rule stops the configure with FATAL_ERROR naming
# the edge ("layering: <target> (<layer>) links <dep> (<layer>)"), so no
# build ever has it. tests/layering checks that it does.
#
# Layers, by the folder a target or file is in (relative to PROJECT_SOURCE_DIR):
#   leaf           common/ and below: links only the leaf, proto and
#                  absl/gRPC/protobuf/OpenSSL/prometheus-cpp/threads
#   core           bridge/{ledger,placement,journal,inventory,config,api}:
#                  links only core, leaf and proto; includes no adapter
#   slurm_plugin   slurm_plugin/: links and includes only itself, the leaf
#                  and proto
#   kube           k8s_adapter/ itself and k8s_adapter/common/: the generic
#                  Kubernetes client (duet_kube, duet_k8s_common); links and
#                  includes only itself, the leaf and proto
#   device_plugin  k8s_adapter/device_plugin/: links and includes only itself,
#                  kube, the leaf and proto
#   kube_config    k8s_adapter/kubeconfig/: kubeconfig files (YAML); links and
#                  includes only itself, kube, the leaf and proto (and
#                  yaml-cpp)
# and one rule on what duet-node may link at all: nothing a kube or
# device_plugin target links, directly or through other targets, is yaml-cpp,
# and no file of theirs includes a yaml-cpp header. Kubeconfig files are
# kube_config's, which only duet-bridge links; duet-node reads no YAML.
#   proto          proto/
# Everything else (bridge/server, bridge/slurm, bridge/pods, bridge/gang (the
# gangs' vocabulary and registry, docs/gangs.md), bridge/dra (the
# DRA lending mode's Lender), the extender, k8s_adapter/reconcile,
# k8s_adapter/http (the HTTP(S) server the extender and the DRA webhook
# share), k8s_adapter/dra (the lending mode's Kubernetes side, which reaches
# the Lender only through bridge/dra/dra_device.h), duetctl, tests, bench) is
# an adapter or a program: unchecked.

set(DUET_CORE_DIRS bridge/ledger bridge/placement bridge/journal bridge/inventory
    bridge/config bridge/api)

# The layer of a folder relative to PROJECT_SOURCE_DIR ("" when unchecked).
function(_duet_layer_of_dir rel out)
  set(layer "")
  if(rel STREQUAL "common" OR rel MATCHES "^common/")
    set(layer leaf)
  elseif(rel STREQUAL "proto" OR rel MATCHES "^proto/")
    set(layer proto)
  elseif(rel STREQUAL "slurm_plugin" OR rel MATCHES "^slurm_plugin/")
    set(layer slurm_plugin)
  elseif(rel STREQUAL "k8s_adapter/device_plugin" OR rel MATCHES "^k8s_adapter/device_plugin/")
    set(layer device_plugin)
  elseif(rel STREQUAL "k8s_adapter/kubeconfig" OR rel MATCHES "^k8s_adapter/kubeconfig/")
    set(layer kube_config)
  elseif(rel STREQUAL "k8s_adapter" OR rel STREQUAL "k8s_adapter/common")
    set(layer kube)
  else()
    foreach(core ${DUET_CORE_DIRS})
      if(rel STREQUAL core OR rel MATCHES "^${core}/")
        set(layer core)
      endif()
    endforeach()
  endif()
  set(${out} "${layer}" PARENT_SCOPE)
endfunction()

# Every target defined under `dir`, recursively.
function(_duet_all_targets dir out)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub ${subdirs})
    _duet_all_targets(${sub} sub_targets)
    list(APPEND targets ${sub_targets})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

# The layer of target `t` ("" when unchecked or not ours); `rel` its folder.
function(_duet_target_layer t out_layer out_rel)
  set(layer "")
  set(rel "")
  get_target_property(imported ${t} IMPORTED)
  if(NOT imported)
    get_target_property(src ${t} SOURCE_DIR)
    file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${src})
    if(NOT rel MATCHES "^\\.\\.")
      _duet_layer_of_dir("${rel}" layer)
    endif()
  endif()
  set(${out_layer} "${layer}" PARENT_SCOPE)
  set(${out_rel} "${rel}" PARENT_SCOPE)
endfunction()

# Whether a dependency in `dep_layer` (or the target `dep`) may be linked
# from `layer`.
function(_duet_link_allowed layer dep dep_layer out)
  set(ok FALSE)
  if(layer STREQUAL "leaf")
    if(dep_layer MATCHES "^(leaf|proto)$")
      set(ok TRUE)
    endif()
  elseif(layer STREQUAL "core")
    if(dep_layer MATCHES "^(core|leaf|proto)$")
      set(ok TRUE)
    endif()
  elseif(layer STREQUAL "slurm_plugin")
    if(dep_layer MATCHES "^(slurm_plugin|leaf|proto)$")
      set(ok TRUE)
    endif()
  elseif(layer STREQUAL "kube")
    if(dep_layer MATCHES "^(kube|leaf|proto)$")
      set(ok TRUE)
    endif()
  elseif(layer STREQUAL "device_plugin")
    if(dep_layer MATCHES "^(device_plugin|kube|leaf|proto)$")
      set(ok TRUE)
    endif()
  elseif(layer STREQUAL "kube_config")
    if(dep_layer MATCHES "^(kube_config|kube|leaf|proto)$")
      set(ok TRUE)
    endif()
  else()
    set(ok TRUE)
  endif()
  set(${out} ${ok} PARENT_SCOPE)
endfunction()

# Whether a quoted #include of `path` may appear in a file of `layer`.
function(_duet_include_allowed layer path out)
  set(ok TRUE)
  # Only paths into duet's own folders are judged; absl/, grpcpp/, the
  # generated duet/v1/ etc. are libraries or proto.
  if(path MATCHES "^(bridge|k8s_adapter|slurm_plugin|duetctl|bench|tests)/")
    set(ok FALSE)
    if(layer STREQUAL "core")
      foreach(core ${DUET_CORE_DIRS})
        if(path MATCHES "^${core}/")
          set(ok TRUE)
        endif()
      endforeach()
    elseif(layer STREQUAL "slurm_plugin")
      if(path MATCHES "^slurm_plugin/")
        set(ok TRUE)
      endif()
    elseif(layer STREQUAL "kube")
      if(path MATCHES "^k8s_adapter/(common/|[^/]+$)")
        set(ok TRUE)
      endif()
    elseif(layer STREQUAL "device_plugin")
      if(path MATCHES "^k8s_adapter/(device_plugin/|common/|[^/]+$)")
        set(ok TRUE)
      endif()
    elseif(layer STREQUAL "kube_config")
      if(path MATCHES "^k8s_adapter/(kubeconfig/|common/|[^/]+$)")
        set(ok TRUE)
      endif()
    endif()
  endif()
  set(${out} ${ok} PARENT_SCOPE)
endfunction()

# The link dependencies of target `t` as written (aliases unresolved), less
# generator expressions other than $<LINK_ONLY:...> and linker flags.
function(_duet_link_deps t out)
  set(deps "")
  get_target_property(type ${t} TYPE)
  get_target_property(imported ${t} IMPORTED)
  if(NOT type STREQUAL "INTERFACE_LIBRARY" AND NOT imported)
    get_target_property(direct ${t} LINK_LIBRARIES)
    if(direct)
      list(APPEND deps ${direct})
    endif()
  endif()
  get_target_property(iface ${t} INTERFACE_LINK_LIBRARIES)
  if(iface)
    list(APPEND deps ${iface})
  endif()
  set(result "")
  foreach(dep ${deps})
    string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" dep "${dep}")
    if(dep MATCHES "^\\$<" OR dep MATCHES "^-" OR dep MATCHES "^::@")
      continue()
    endif()
    list(APPEND result "${dep}")
  endforeach()
  list(REMOVE_DUPLICATES result)
  set(${out} "${result}" PARENT_SCOPE)
endfunction()

# Whether target `t` links, directly or through other targets, a library
# whose name (alias resolved) matches `regex`: `out_dep` is the first such
# name ("" when none), `out_via` the targets between, as "a -> b" ("" when
# `t` links it itself).
function(_duet_find_linked t regex out_dep out_via)
  set(queue ${t})
  set(seen ${t})
  set(found "")
  set(via "")
  while(queue AND found STREQUAL "")
    list(POP_FRONT queue cur)
    string(MAKE_C_IDENTIFIER "${cur}" cur_id)
    _duet_link_deps(${cur} deps)
    foreach(dep ${deps})
      set(name "${dep}")
      if(TARGET ${dep})
        get_target_property(aliased ${dep} ALIASED_TARGET)
        if(aliased)
          set(name ${aliased})
        endif()
      endif()
      if(name MATCHES "${regex}" OR dep MATCHES "${regex}")
        set(found "${name}")
        # The chain back from `cur` to `t`, `t` itself left out.
        set(node ${cur})
        set(chain "")
        while(NOT node STREQUAL t)
          list(PREPEND chain ${node})
          string(MAKE_C_IDENTIFIER "${node}" node_id)
          set(node ${_duet_parent_${node_id}})
        endwhile()
        list(JOIN chain " -> " via)
        break()
      endif()
      if(TARGET ${name})
        list(FIND seen ${name} at)
        if(at EQUAL -1)
          list(APPEND seen ${name})
          list(APPEND queue ${name})
          string(MAKE_C_IDENTIFIER "${name}" name_id)
          set(_duet_parent_${name_id} ${cur})
        endif()
      endif()
    endforeach()
  endwhile()
  set(${out_dep} "${found}" PARENT_SCOPE)
  set(${out_via} "${via}" PARENT_SCOPE)
endfunction()

function(duet_check_layering)
  set(errors "")
  set(leaf_external "^(absl::|gRPC::|protobuf::|OpenSSL::|prometheus-cpp::|Threads::Threads$)")
  # yaml-cpp as a target (0.7: yaml-cpp; 0.8: yaml-cpp::yaml-cpp) or a file.
  set(yaml_lib "^yaml-cpp(::yaml-cpp)?$|(^|/)libyaml-cpp[^/]*$")
  _duet_all_targets(${PROJECT_SOURCE_DIR} targets)
  foreach(t ${targets})
    _duet_target_layer(${t} layer rel)
    if(layer STREQUAL "")
      continue()
    endif()
    _duet_link_deps(${t} deps)
    foreach(dep ${deps})
      set(dep_name "${dep}")
      set(dep_layer "")
      set(ours FALSE)
      if(TARGET ${dep})
        get_target_property(aliased ${dep} ALIASED_TARGET)
        if(aliased)
          set(dep_name ${aliased})
        endif()
        _duet_target_layer(${dep_name} dep_layer dep_rel)
        get_target_property(dep_imported ${dep_name} IMPORTED)
        if(NOT dep_imported AND NOT dep_rel MATCHES "^\\.\\.")
          set(ours TRUE)
        endif()
      endif()
      if(ours)
        _duet_link_allowed(${layer} ${dep_name} "${dep_layer}" ok)
        if(NOT ok)
          if(dep_layer STREQUAL "")
            set(dep_layer "adapter")
          endif()
          list(APPEND errors
               "layering: ${t} (${layer}, ${rel}) links ${dep_name} (${dep_layer}, ${dep_rel})")
        endif()
      elseif(layer STREQUAL "leaf" AND NOT dep MATCHES "${leaf_external}")
        list(APPEND errors
             "layering: ${t} (leaf, ${rel}) links ${dep}, which the leaf may not use (only absl, gRPC, protobuf, OpenSSL, prometheus-cpp, threads)")
      endif()
    endforeach()
    # duet-node reads no YAML: nothing under kube or device_plugin links
    # yaml-cpp, however indirectly.
    if(layer MATCHES "^(kube|device_plugin)$")
      _duet_find_linked(${t} "${yaml_lib}" yaml via)
      if(NOT yaml STREQUAL "")
        if(NOT via STREQUAL "")
          set(via " (through ${via})")
        endif()
        list(APPEND errors
             "layering: ${t} (${layer}, ${rel}) links ${yaml}${via}: duet-node reads no YAML (kubeconfig files are duet_kube_config's, k8s_adapter/kubeconfig)")
      endif()
    endif()
  endforeach()

  # #include lines of the checked folders.
  file(GLOB_RECURSE sources RELATIVE ${PROJECT_SOURCE_DIR}
       ${PROJECT_SOURCE_DIR}/common/*.h ${PROJECT_SOURCE_DIR}/common/*.cc
       ${PROJECT_SOURCE_DIR}/slurm_plugin/*.h ${PROJECT_SOURCE_DIR}/slurm_plugin/*.c
       ${PROJECT_SOURCE_DIR}/slurm_plugin/*.cc
       ${PROJECT_SOURCE_DIR}/k8s_adapter/device_plugin/*.h
       ${PROJECT_SOURCE_DIR}/k8s_adapter/device_plugin/*.cc
       ${PROJECT_SOURCE_DIR}/k8s_adapter/common/*.h ${PROJECT_SOURCE_DIR}/k8s_adapter/common/*.cc
       ${PROJECT_SOURCE_DIR}/k8s_adapter/kubeconfig/*.h
       ${PROJECT_SOURCE_DIR}/k8s_adapter/kubeconfig/*.cc)
  file(GLOB kube_sources RELATIVE ${PROJECT_SOURCE_DIR}
       ${PROJECT_SOURCE_DIR}/k8s_adapter/*.h ${PROJECT_SOURCE_DIR}/k8s_adapter/*.cc)
  list(APPEND sources ${kube_sources})
  foreach(core ${DUET_CORE_DIRS})
    file(GLOB_RECURSE core_sources RELATIVE ${PROJECT_SOURCE_DIR}
         ${PROJECT_SOURCE_DIR}/${core}/*.h ${PROJECT_SOURCE_DIR}/${core}/*.cc)
    list(APPEND sources ${core_sources})
  endforeach()
  foreach(f ${sources})
    get_filename_component(dir ${f} DIRECTORY)
    _duet_layer_of_dir("${dir}" layer)
    if(layer STREQUAL "leaf")
      set(layer leaf_includes)
    endif()
    file(STRINGS ${PROJECT_SOURCE_DIR}/${f} lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
    foreach(line ${lines})
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]*)\".*" "\\1" path "${line}")
      if(layer STREQUAL "leaf_includes")
        # The leaf includes nothing of duet's but itself and proto/.
        if(path MATCHES "^(bridge|k8s_adapter|slurm_plugin|duetctl|bench|tests)/")
          list(APPEND errors "layering: ${f} (leaf) includes ${path}")
        endif()
      else()
        _duet_include_allowed(${layer} "${path}" ok)
        if(NOT ok)
          list(APPEND errors "layering: ${f} (${layer}) includes ${path}")
        endif()
      endif()
    endforeach()
    if(layer MATCHES "^(kube|device_plugin)$")
      file(STRINGS ${PROJECT_SOURCE_DIR}/${f} yaml_lines
           REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]yaml-cpp/")
      foreach(line ${yaml_lines})
        string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*[<\"]([^>\"]*)[>\"].*" "\\1" path "${line}")
        list(APPEND errors
             "layering: ${f} (${layer}) includes ${path}: duet-node reads no YAML (kubeconfig files are duet_kube_config's, k8s_adapter/kubeconfig)")
      endforeach()
    endif()
  endforeach()

  if(errors)
    list(JOIN errors "\n  " text)
    message(FATAL_ERROR "duet's dependency rules (bridge/README.md) are broken:\n  ${text}\n"
                        "Move the shared code into common/, or depend on an interface the "
                        "core owns.")
  endif()
  message(STATUS "layering: the leaf, core, kube, kube_config, slurm_plugin and device_plugin rules hold, and duet-node links no yaml-cpp")
endfunction()
